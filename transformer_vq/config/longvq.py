"""LongVQ configuration (Liu et al. 2024): a frozen, validated dataclass and its presets (docs/longvq.md)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer_vq.config.applies import switch_problems
from transformer_vq.config.fields import ConfigError, check, option
from transformer_vq.config.model import PROBABILITY, TransformerVQConfig

LONGVQ_SCORINGS = ("softmax", "relu2")
"""LongVQ's attention functions (its eq. 16 and Sec. 9.2); the causal operator computes softmax only."""
NORMS = ("layer", "batch", "scale")
"""The normalizations of LongVQ's Table 7: layer norm (LN), batch norm (BN), scale norm (SN)."""
MIN_TIMESCALE = 2.0
"""The smallest ``ema_timescale`` other than 0: tau is drawn from [1.5, T], so T must exceed 1.5."""
LM_IS_CAUSAL = "a language model is causal; an encoder classifier trains with tvq classify train"
"""Why a language model's refusals offer no ``causal false`` (``tvq train`` refuses it) and where an encoder is."""


@dataclass(frozen=True)
class LongVQConfig:
    """Hyperparameters of a LongVQ model: a classifier (``n_classes > 0``) or a causal language model (``0``).

    Each of the ``n_layers`` blocks is a LongVQ layer (SSM, gated VQ attention, output gate: eqs. 9-20) followed by
    a norm, a position-wise FFN and a norm (eqs. 21-22). Fields marked ``training_only`` change training but not
    what the weights mean.
    """

    vocab_size: int = option(256, "Number of token ids.", min=1)
    d_model: int = option(512, "Model width d (Table 8: 'Model size').", min=1)
    d_qk: int = option(128, "Query/key width (Table 8: 'Shared Repr. size (z)').", min=1)
    d_v: int = option(1024, "Value and attention-gate width (Table 8: 'Value Seq. size (v)').", min=1)
    d_ffn: int = option(1024, "Hidden width of the position-wise FFN (Table 8: 'FFN Hidden size').", min=1)
    n_layers: int = option(12, "Number of LongVQ blocks.", min=1)
    ema_dim: int = option(16, "State size of the SSM per channel: the damped EMA's dimension h (Table 8).", min=1)
    ema_timescale: float = option(0.0, "Initial timescales of the SSM: 0 for Mega's initialization (decays near 0.75, "
                                       "a memory of a few tokens); T >= 2 for alpha = 1/tau, tau log-uniform over "
                                       "[1.5, T] per channel and EMA dimension (memories up to about 2T tokens).",
                                  min=0.0)
    n_code: int = option(512, "Codebook size S of each layer's key quantizer (Sec. 5: 512).", min=1)
    block_len: int = option(512, "Block length L of the local-bias window (the paper leaves it open).", min=1)
    scoring: str = option("softmax", "Attention function: 'softmax' or 'relu2' (eq. 16) of an encoder (causal false; "
                                     "the causal operator computes softmax).", choices=LONGVQ_SCORINGS,
                          applies={"causal": (False,)})
    norm: str = option("layer", "Normalization of eqs. 21-22: 'layer', 'batch' or 'scale' (Table 7; causal "
                                 "models: layer or scale).", choices=NORMS)
    dropout: float = option(0.1, "Dropout on the attention branch and in the FFN.", **PROBABILITY,
                            training_only=True)
    n_classes: int = option(0, "Number of classes of a classifier (mean pooling, linear head); 0: a language "
                               "model.", min=0)
    causal: bool = option(True, "Causal SSM and attention (a language model must be causal). False: an encoder, "
                                "a backward SSM too and attention over every real token.")
    commit_coef: float = option(1e-4, "Commitment loss coefficient gamma (eq. 23; Sec. 5: 1e-4).", min=0.0,
                                training_only=True)
    ema_rate: float = option(0.99, "Codebook EMA rate (Sec. 5: 0.99).", min=0.0, max=1.0, min_open=True,
                             max_open=True, training_only=True)
    dead_code_restart: int = option(0, "Re-seed codes unused for this many codebook updates from recent keys "
                                       "(0 = off).", min=0, training_only=True, off=0)

    def __post_init__(self):
        extra = []
        # A language model (tvq train --arch longvq) is causal whatever its flags: its refusals offer no "causal
        # false", which that command refuses, and name the command that trains an encoder.
        language_model = self.n_classes == 0
        if self.norm == "batch" and self.causal is True:
            # batch norm's training statistics are taken over every position of a sequence: a causal model's
            # output at t would depend on the tokens after t
            extra.append(("norm", "'batch' mixes the positions of a sequence (its statistics are taken over time), "
                                  "so a causal model would see later tokens: use norm 'layer' or 'scale'"
                                  + (f" ({LM_IS_CAUSAL})" if language_model else ", or causal false for an encoder")))
        if 0 < self.ema_timescale < MIN_TIMESCALE:
            extra.append(("ema_timescale", f"must be 0 (Mega's initialization) or at least {MIN_TIMESCALE}"))
        if language_model and self.causal is False:
            extra.append(("causal", "false is an encoder's, and an encoder is a classifier (n_classes > 0; "
                                    "tvq classify train): a language model (n_classes 0) is causal"))
        check(self, extra + switch_problems(self, fixed={"causal": LM_IS_CAUSAL} if language_model else None))

    # The generic dataclass helpers of the Transformer-VQ config serve this one unchanged.
    replace = TransformerVQConfig.replace
    to_dict = TransformerVQConfig.to_dict
    from_dict = TransformerVQConfig.__dict__["from_dict"]


LONGVQ_PRESETS: dict[str, LongVQConfig] = {
    # Table 8, enwik8 (47M parameters in the paper). The block length is not given there: ours.
    "enwik8": LongVQConfig(vocab_size=256, d_model=512, d_qk=128, d_v=1024, d_ffn=1024, n_layers=12, ema_dim=16,
                           n_code=512, block_len=512, dropout=0.1),
    # The test-suite model (a language model; tests set n_classes and causal for a classifier).
    "tiny": LongVQConfig(vocab_size=256, d_model=32, d_qk=16, d_v=64, d_ffn=64, n_layers=2, ema_dim=4, n_code=8,
                         block_len=8, dropout=0.0),
}


LONGVQ_LM_PRESETS: dict[str, LongVQConfig] = {
    **LONGVQ_PRESETS,
    # The CPU-sized language model, as wide and deep as Transformer-VQ's `small` (about 1.5M parameters).
    "small": LongVQConfig(vocab_size=256, d_model=256, d_qk=64, d_v=512, d_ffn=512, n_layers=2, ema_dim=16,
                          n_code=64, block_len=64, dropout=0.1),
}
"""The presets of ``tvq train --arch longvq``."""

CLASSIFY_PRESETS: dict[str, LongVQConfig] = {
    **LONGVQ_PRESETS,
    # A CPU-sized classifier for short sequences (digits, small ListOps): minutes, not hours, on 2 cores.
    "small": LongVQConfig(d_model=64, d_qk=32, d_v=128, d_ffn=128, n_layers=2, ema_dim=8, n_code=64, block_len=32,
                          dropout=0.1),
}
"""The presets of every classifier (``tvq classify train``; each arch reads the same fields)."""


def longvq_preset(name: str, task: str | None = None, **overrides) -> LongVQConfig:
    """The LongVQ preset ``name`` of ``task`` with ``overrides`` applied (e.g. ``longvq_preset("tiny",
    n_classes=10)``): ``task`` "lm" reads the presets of ``tvq train --arch longvq``, "classify" those of ``tvq
    classify train``; ``None``: "classify" when the overrides build a classifier (``n_classes`` above 0, or
    ``causal`` false), else "lm". They share ``enwik8`` and ``tiny``; ``small`` differs: the language model's is
    d_model 256 (about 1.7M parameters), the classifier's d_model 64 (about 0.13M)."""
    if task is None:
        task = "classify" if overrides.get("n_classes") or overrides.get("causal") is False else "lm"
    presets = {"lm": LONGVQ_LM_PRESETS, "classify": CLASSIFY_PRESETS}
    if task not in presets:
        raise ConfigError(f"task must be 'lm' or 'classify', got {task!r}")
    if name not in presets[task]:
        raise ConfigError(f"unknown LongVQ {task} preset {name!r}; available: {', '.join(presets[task])}")
    return presets[task][name].replace(**overrides)
