"""The language-model architectures of ``tvq train``: Transformer-VQ (``tvq``, the default) and LongVQ's causal
language model (``longvq``), each with its model config class and its presets. A run's ``arch`` says which class
its ``model`` section is (docs/longvq.md, "Language modeling"). Torch-free, so that ``tvq --help`` stays fast."""

from __future__ import annotations

import dataclasses

from transformer_vq.config.fields import ConfigError
from transformer_vq.config.longvq import LONGVQ_PRESETS, LongVQConfig
from transformer_vq.config.model import PRESETS, TransformerVQConfig

LM_ARCHS = ("tvq", "longvq")
"""'tvq': Transformer-VQ; 'longvq': LongVQ's causal language model (SSM and gated VQ attention)."""
DEFAULT_ARCH = "tvq"
"""The architecture of a run config that names none (every run directory written before LongVQ existed)."""
DEFAULT_PRESET = "small"
"""The model preset of a run that names none, for either architecture."""

MODEL_CLASSES = {"tvq": TransformerVQConfig, "longvq": LongVQConfig}

LONGVQ_LM_PRESETS: dict[str, LongVQConfig] = {
    **LONGVQ_PRESETS,
    # The CPU-sized language model, as wide and deep as Transformer-VQ's `small` (about 1.5M parameters).
    "small": LongVQConfig(vocab_size=256, d_model=256, d_qk=64, d_v=512, d_ffn=512, n_layers=2, ema_dim=16,
                          n_code=64, block_len=64, dropout=0.1),
}
LM_PRESETS = {"tvq": PRESETS, "longvq": LONGVQ_LM_PRESETS}


def check_arch(arch) -> str:
    """``arch`` when it names an architecture; a :class:`ConfigError` naming the choices otherwise."""
    if arch not in LM_ARCHS:
        raise ConfigError(f"unknown architecture {arch!r}; available: {', '.join(LM_ARCHS)}")
    return arch


def arch_of(model) -> str:
    """The architecture whose config class ``model`` (a model config) is."""
    for arch, cls in MODEL_CLASSES.items():
        if type(model) is cls:
            return arch
    raise ConfigError(f"a language-model run takes a {' or a '.join(c.__name__ for c in MODEL_CLASSES.values())}, "
                      f"got {type(model).__name__}")


def lm_preset(arch: str, name: str | None):
    """The model preset ``name`` (default ``small``) of architecture ``arch``."""
    presets = LM_PRESETS[check_arch(arch)]
    name = DEFAULT_PRESET if name is None else name
    if name not in presets:
        of = "" if arch == DEFAULT_ARCH else f" of arch {arch!r}"
        raise ConfigError(f"unknown model preset {name!r}{of}; available: {', '.join(presets)}")
    return presets[name]


def foreign_fields(arch: str, names) -> str | None:
    """Why model fields ``names`` cannot configure an ``arch`` model, when some belong to another architecture only
    (None when every name is one of its fields, or none is known at all: the builder names those)."""
    own = {f.name for f in dataclasses.fields(MODEL_CLASSES[arch])}
    for other, cls in MODEL_CLASSES.items():
        theirs = sorted((set(names) - own) & {f.name for f in dataclasses.fields(cls)})
        if other != arch and theirs:
            return (f"model field(s) {', '.join(theirs)} belong to arch {other!r}, and this run's arch is {arch!r}; "
                    f"give --arch {other} (arch: {other} in a config file) or leave them out")
    return None
