"""The registry of architectures: every model the commands build, by task and name (``--arch``), with its model
config class, its model class, its presets, and the commands and options that apply to it. Build, the command line,
``tvq export`` and ``tvq codebook`` read it; nothing else lists architectures.

Two tasks: ``lm`` (``tvq train``, whose run config names the architecture in ``arch``) and ``classify`` (``tvq
classify train``, whose training config names it in ``train.arch``). Torch-free, so that ``tvq --help`` stays fast:
a model class is named by its import path and imported where a model is built (:mod:`transformer_vq.train.models`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from transformer_vq.config.fields import ConfigError
from transformer_vq.config.longvq import CLASSIFY_PRESETS, LONGVQ_LM_PRESETS, LongVQConfig
from transformer_vq.config.model import PRESETS, TransformerVQConfig

TASKS = {"lm": "tvq train", "classify": "tvq classify train"}
"""What an architecture is trained for (language modeling, classification), with the command that trains it."""
DEFAULT_ARCH = "tvq"
"""The architecture of a language-model run config that names none (every run written before LongVQ existed)."""
DEFAULT_PRESET = "small"
"""The model preset of a run that names none, for every architecture."""


@dataclass(frozen=True)
class Arch:
    """One architecture of one task."""

    task: str
    """``lm`` or ``classify`` (:data:`TASKS`)."""
    name: str
    """As ``--arch`` spells it (unique within its task)."""
    title: str
    """What it is, for messages ("a ...")."""
    config: type
    """Its model config class (the ``model`` section of its run configs)."""
    model: str
    """Its model class, as ``module:Class`` (built with the model config as its one argument)."""
    presets: Mapping[str, object]
    """Its model presets (``--preset``), instances of :attr:`config`."""
    commands: frozenset[str] = frozenset()
    """The commands beyond its task's own (train, eval, sample; classify train, eval) that read its checkpoints:
    ``export``, ``codebook``."""
    refused_options: Mapping[str, str] = field(default_factory=dict)
    """Training options that do not apply to it (a value other than the option's default is refused), each with the
    reason."""


ARCHS: tuple[Arch, ...] = (
    Arch("lm", "tvq", "a Transformer-VQ language model", TransformerVQConfig,
         "transformer_vq.models.tvq.model:TransformerVQ", PRESETS, frozenset({"export", "codebook"})),
    Arch("lm", "longvq", "a LongVQ causal language model (SSM and gated VQ attention)", LongVQConfig,
         "transformer_vq.models.longvq.model:LongVQLM", LONGVQ_LM_PRESETS,
         refused_options={"torch_compile": "compiles Transformer-VQ's gated attention units, which a LongVQ model "
                                           "has none of (leave it off)",
                         "context_parallel": "hands a rank the VQ-attention state of the ranks before it, and a "
                                             "LongVQ model's SSM state is not handed over (leave it at 1)",
                          "pack": "packs documents for Transformer-VQ's operators; a LongVQ model's SSM would carry "
                                  "one document into the next (leave it off)"}),
    Arch("classify", "longvq", "a LongVQ classifier", LongVQConfig,
         "transformer_vq.models.longvq.model:LongVQClassifier", CLASSIFY_PRESETS),
    Arch("classify", "transformer", "a full-attention Transformer classifier (baseline)", LongVQConfig,
         "transformer_vq.models.baselines.classifiers:TransformerClassifier", CLASSIFY_PRESETS),
    Arch("classify", "tvq", "a Transformer-VQ encoder classifier (baseline)", LongVQConfig,
         "transformer_vq.models.baselines.classifiers:TransformerVQEncoderClassifier", CLASSIFY_PRESETS),
)


def names(task: str) -> tuple[str, ...]:
    """The architectures of ``task``, as ``--arch`` spells them."""
    return tuple(a.name for a in ARCHS if a.task == task)


LM_ARCHS = names("lm")
"""'tvq': Transformer-VQ; 'longvq': LongVQ's causal language model."""
CLASSIFY_ARCHS = names("classify")
"""The classifiers: LongVQ, the full-attention Transformer baseline, the Transformer-VQ encoder (docs/longvq.md)."""
LM_PRESETS = {a.name: a.presets for a in ARCHS if a.task == "lm"}


def find_arch(task: str, name) -> Arch:
    """The architecture ``name`` of ``task``; a :class:`ConfigError` naming the choices otherwise."""
    for a in ARCHS:
        if a.task == task and a.name == name:
            return a
    raise ConfigError(f"unknown architecture {name!r}; available: {', '.join(names(task))}")


def run_arch(config: dict) -> Arch:
    """The architecture of a saved run config (a checkpoint's ``config.json``): a classification run's names it in
    ``train.arch``, a language-model run's in ``arch`` (none: Transformer-VQ)."""
    train = config.get("train")
    if isinstance(train, dict) and "arch" in train:
        return find_arch("classify", train["arch"])
    return find_arch("lm", config.get("arch", DEFAULT_ARCH))


def arch_of(model) -> str:
    """The language-model architecture whose config class ``model`` (a model config) is."""
    for a in ARCHS:
        if a.task == "lm" and type(model) is a.config:
            return a.name
    classes = [a.config.__name__ for a in ARCHS if a.task == "lm"]
    raise ConfigError(f"a language-model run takes a {' or a '.join(classes)}, got {type(model).__name__}")


def lm_preset(name: str, preset: str | None):
    """The model preset ``preset`` (default ``small``) of language-model architecture ``name``."""
    presets = find_arch("lm", name).presets
    preset = DEFAULT_PRESET if preset is None else preset
    if preset not in presets:
        of = "" if name == DEFAULT_ARCH else f" of arch {name!r}"
        raise ConfigError(f"unknown model preset {preset!r}{of}; available: {', '.join(presets)}")
    return presets[preset]


def foreign_fields(name: str, fields) -> str | None:
    """Why model fields ``fields`` cannot configure a ``name`` language model, when some belong to another
    architecture only (None when every one is its own, or none is known at all: the builder names those)."""
    own = {f.name for f in dataclasses.fields(find_arch("lm", name).config)}
    for other in ARCHS:
        theirs = sorted((set(fields) - own) & {f.name for f in dataclasses.fields(other.config)})
        if other.task == "lm" and other.name != name and theirs:
            return (f"model field(s) {', '.join(theirs)} belong to arch {other.name!r}, and this run's arch is "
                    f"{name!r}; give --arch {other.name} (arch: {other.name} in a config file) or leave them out")
    return None



def serving(command: str) -> str:
    """The architectures whose checkpoints ``command`` reads, for its refusals: "a Transformer-VQ language model
    (tvq train --arch tvq)"."""
    return " or ".join(f"{a.title} ({TASKS[a.task]} --arch {a.name})" for a in ARCHS if command in a.commands)
