"""Model configuration: a frozen, validated dataclass and the paper's presets (App. C, Table 10)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from transformer_vq.config.choices import (ATTN_BACKENDS, ATTN_TYPES, BIAS_SPANS, HEAD_TYPES, NONCAUSAL_ATTN_TYPES,
                                           REDUCTIONS)
from transformer_vq.config.applies import switch_problems
from transformer_vq.config.fields import ConfigError, check, fields_of, option, unknown_message

PROBABILITY = dict(min=0.0, max=1.0, max_open=True)
VQ = {"attn_type": ("vq",)}
"""Where an option of the codebooks applies: VQ attention (the baselines have no codebook)."""
CACHED_VQ = {**VQ, "causal": (True,), "compressive_cache": (True,)}
"""Where an option of the per-code cache applies: causal VQ attention that keeps the cache."""


@dataclass(frozen=True)
class TransformerVQConfig:
    """Hyperparameters of a Transformer-VQ language model.

    A model has ``n_layers`` layers, each two gated attention units (GAUs) with pre-norm residuals, so
    the paper's "num gau N = 48" is ``n_layers = 24``. Fields marked ``training_only`` change training but
    not what the weights mean: a resumed or evaluated run may give them new values.
    """

    vocab_size: int = option(256, "Number of token ids (256 for byte-level text and images).", min=1)
    d_model: int = option(768, "Residual stream width D_m.", min=1)
    d_k: int = option(128, "Query/key width per head D_k.", min=1)
    d_v: int = option(1536, "Total value/gate width D_v (the paper uses 2 * d_model); split evenly over heads.",
                      min=1)
    n_layers: int = option(24, "Number of layers; each layer is two GAUs.", min=1)
    n_code: int = option(512, "Codebook size S (codewords per key group).", min=1, applies=VQ)
    block_len: int = option(512, "Block length L of the linear-time attention; training windows are multiples "
                                 "of it.", min=1)
    head_type: str = option("shga", "'shga' (one head, the GAU), 'mqa' (n_head query heads sharing one key/value "
                                    "head), 'mha'.", choices=HEAD_TYPES)
    n_head: int = option(1, "Number of query heads (must be 1 for 'shga').", min=1)
    attn_type: str = option("vq", "'vq' (Transformer-VQ); baselines 'full' (softmax, unquantized), 'flash_quad', "
                                  "'flash'.", choices=ATTN_TYPES)
    reduction: str = option("serial", "How the per-code cache is accumulated across blocks: 'serial', 'matmul' "
                                      "or 'assoc' (App. B/E).", choices=REDUCTIONS, training_only=True,
                       applies=CACHED_VQ)
    attn_backend: str = option("eager", "How causal VQ attention computes whole blocks: 'eager' (torch ops) or "
                                        "'triton' (fused kernels on CUDA; pip install -e \".[triton]\").",
                               choices=ATTN_BACKENDS, training_only=True,
                               applies={**CACHED_VQ, "quantize_queries": (False,)})
    commit_coef: float = option(1e-4, "Commitment loss coefficient beta (Eq. 35).", min=0.0, training_only=True,
                               applies=VQ)
    ema_rate: float = option(0.99, "Codebook EMA rate gamma.", min=0.0, max=1.0, min_open=True, max_open=True,
                             training_only=True, applies=VQ)
    dead_code_restart: int = option(0, "Re-seed codes unused for this many codebook updates from recent keys "
                                       "(0 = off).", min=0, training_only=True, applies=VQ, off=0)
    max_wavelength: float = option(1e5, "Maximum wavelength of every sinusoid table (App. C).", min=1.0,
                                   min_open=True)
    bias_span: str = option("window", "How far the relative-position bias reaches: 'window' (every key of the "
                                      "two-block window, distances up to 2L - 1) or 'block' (distances up to L, as "
                                      "the authors' code; keys further back attend without the bias).",
                            choices=BIAS_SPANS)
    dropsin: float = option(0.0, "Dropout on the relative-position sinusoids (p_dropsin).", **PROBABILITY,
                            training_only=True)
    dropres: float = option(0.0, "Dropout on each GAU's residual branch (p_dropres).", **PROBABILITY,
                            training_only=True)
    droplyr: float = option(0.0, "LayerDrop: probability of skipping a whole GAU in training (p_droplyr).",
                            **PROBABILITY, training_only=True)
    abs_pos: bool = option(False, "Add absolute ScaledSin position embeddings to the token embeddings (the "
                                  "paper's image models).")
    final_norm: bool = option(False, "RMS-normalize the residual stream before the output head (the paper's "
                                     "large models).")
    tie_embeddings: bool = option(False, "Share the output head with the token embedding (scaled down), as the "
                                         "paper's large models.")
    flash_chunk_len: int = option(256, "Chunk length of the 'flash' baseline's mixed-chunk attention.", min=1,
                                 applies={"attn_type": ("flash",)})
    causal: bool = option(True, "Causal attention (a language model). False: an encoder, every query attends "
                                "every key with a local bias over its own and the two neighbouring blocks; "
                                "trained by masked-token prediction (docs/operator.md).",
                         applies={"attn_type": NONCAUSAL_ATTN_TYPES})
    quantize_queries: bool = option(False, "Quantize the queries too, against a codebook of their own (n_code "
                                           "codes per head): scores come from a table of code-pair scores "
                                           "(attn_type 'vq' only).", applies=VQ, off=False)
    compressive_cache: bool = option(True, "VQ attention over every past key: the two-block window directly, older "
                                           "keys through the per-code cache (Theorem 3.7). False: the window only, "
                                           "no cache (the paper's Table 2 ablation; causal attn_type 'vq' only).",
                                   applies={**VQ, "causal": (True,)})
    cache_bias_init: float | None = option(None, "A learned logit per query head on every key older than the "
                                                 "two-block window (the per-code cache), initialized to this value "
                                                 "(e.g. -6: the cache starts with e^-6 of its weight, the measured "
                                                 "choice on text: on Shakespeare the cache pays from ~1,800 steps); "
                                                 "none: the paper's model, no such logit (docs/quality.md, \"The "
                                                 "cost is a slow start\"). Within +-50: beyond, the cache is all or "
                                                 "nothing.",
                                           off=None, min=-50.0, max=50.0,
                                           applies={**CACHED_VQ, "quantize_queries": (False,),
                                                    "attn_backend": ("eager",)})
    mask_rate: float = option(0.15, "Encoders (causal false): fraction of the tokens of a window masked and "
                                    "predicted in training.", min=0.0, max=1.0, min_open=True, max_open=True,
                              training_only=True, applies={"causal": (False,)})

    def __post_init__(self):
        extra = []
        if self.head_type == "shga" and self.n_head != 1:
            extra.append(("n_head", f"must be 1 for head_type 'shga' (use 'mqa' or 'mha'), got {self.n_head}"))
        if isinstance(self.n_head, int) and self.n_head >= 1 and isinstance(self.d_v, int):
            if self.d_v % self.n_head != 0:
                extra.append(("d_v", f"must be divisible by n_head={self.n_head}, got {self.d_v}"))
        if isinstance(self.d_model, int) and self.d_model >= 1 and self.d_model % 2 != 0:
            extra.append(("d_model", f"must be even (sinusoid tables pair sin and cos), got {self.d_model}"))
        check(self, extra + switch_problems(self))

    def context_parallel_problem(self) -> str | None:
        """Why this model cannot split a sequence over ranks along time (None when it can): context parallelism
        hands each rank the VQ-attention state of the ranks before it (a per-code cache and one block), which only
        causal attn_type 'vq' with its cache and unquantized queries has (docs/distributed.md)."""
        reasons = [(self.attn_type != "vq", f"attn_type 'vq', got {self.attn_type!r}"),
                   (not self.causal, "causal attention, got an encoder (causal false)"),
                   (not self.compressive_cache, "the per-code cache, got compressive_cache false"),
                   (self.quantize_queries, "unquantized queries, got quantize_queries true")]
        for refused, text in reasons:
            if refused:
                return f"needs {text}"
        return None

    @property
    def n_kv_head(self) -> int:
        """Number of key/value groups G: 1 for 'shga' and 'mqa', n_head for 'mha'."""
        return self.n_head if self.head_type == "mha" else 1

    @property
    def d_v_head(self) -> int:
        """Value width of one head."""
        return self.d_v // self.n_head

    @property
    def mask_token_id(self) -> int | None:
        """The id of the mask token of an encoder (one past the vocabulary); None for a causal model."""
        return None if self.causal else self.vocab_size

    def replace(self, **changes) -> "TransformerVQConfig":
        """A copy with some fields changed (validated again); a name that is no field is refused with the known
        ones (a misspelt ``nlayers`` got dataclasses' bare ``TypeError``)."""
        unknown = set(changes) - set(fields_of(type(self)))
        if unknown:
            raise ConfigError(unknown_message(unknown, f"{type(self).__name__}", fields_of(type(self))))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as plain values (tuples stay tuples; JSON writes them as lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TransformerVQConfig":
        """Build from a dict, rejecting unknown keys by name."""
        known = set(fields_of(cls))
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model config key(s): {', '.join(unknown)}; "
                              f"known keys: {', '.join(sorted(known))}")
        return cls(**values)


# Model fields that only change training, not what the weights mean: a run may resume with new values.
TRAINING_ONLY_FIELDS = frozenset(f.name for f in dataclasses.fields(TransformerVQConfig)
                                 if f.metadata.get("training_only"))

PRESETS: dict[str, TransformerVQConfig] = {
    # App. C, Table 10. Parameter counts are the paper's; dropout rates are the paper's regularization.
    "enwik8": TransformerVQConfig(
        vocab_size=256, d_model=768, d_k=128, d_v=1536, n_layers=24, n_code=512, block_len=512,
        dropsin=0.2, dropres=0.5, droplyr=0.3,
    ),
    "pg19": TransformerVQConfig(
        vocab_size=32000, d_model=2048, d_k=128, d_v=4096, n_layers=24, n_code=512, block_len=512,
        dropsin=0.1, dropres=0.1, droplyr=0.1, final_norm=True, tie_embeddings=True,
    ),
    "imagenet64": TransformerVQConfig(
        vocab_size=256, d_model=2048, d_k=128, d_v=4096, n_layers=24, n_code=512, block_len=512,
        dropsin=0.1, abs_pos=True, final_norm=True, tie_embeddings=True,
    ),
    # Small models for CPU: the default `tvq train` model and the test-suite model.
    # small: S = 4L (256 codes for blocks of 64), the rule of docs/quality.md ("Codebook size for the small preset"):
    # at S = 64 VQ was 1.52% behind unquantized keys on Shakespeare, at S = 256 0.54% ahead (2 seeds, the whole split;
    # benchmarks/results/preset-codebook-size-shakespeare-small-600steps-2026-11-26.md), and 4L was also gcide's best.
    "small": TransformerVQConfig(
        vocab_size=256, d_model=256, d_k=64, d_v=512, n_layers=2, n_code=256, block_len=64, dropsin=0.1,
    ),
    "tiny": TransformerVQConfig(
        vocab_size=256, d_model=32, d_k=16, d_v=64, n_layers=1, n_code=8, block_len=8,
    ),
}


def preset(name: str, **overrides) -> TransformerVQConfig:
    """The preset ``name`` with ``overrides`` applied (e.g. ``preset("enwik8", n_layers=2)``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)
