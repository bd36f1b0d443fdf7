"""Model configuration: a frozen, validated dataclass and the paper's presets (App. C, Table 10)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

HEAD_TYPES = ("shga", "mqa", "mha")
ATTN_TYPES = ("vq", "full", "flash_quad", "flash")
REDUCTIONS = ("serial", "matmul", "assoc")


@dataclass(frozen=True)
class TransformerVQConfig:
    """Hyperparameters of a Transformer-VQ language model.

    A model has ``n_layers`` layers, each two gated attention units (GAUs) with pre-norm residuals, so
    the paper's "num gau N = 48" is ``n_layers = 24``.
    """

    vocab_size: int = 256
    """Number of token ids (256 for byte-level text and images)."""
    d_model: int = 768
    """Residual stream width D_m."""
    d_k: int = 128
    """Query/key width per head D_k."""
    d_v: int = 1536
    """Total value/gate width D_v (the paper uses 2 * d_model); split evenly over heads."""
    n_layers: int = 24
    """Number of layers; each layer is two GAUs."""
    n_code: int = 512
    """Codebook size S (codewords per key group)."""
    block_len: int = 512
    """Block length L of the linear-time attention; training windows are multiples of it."""
    head_type: str = "shga"
    """'shga' (one head, the GAU), 'mqa' (n_head query heads sharing one key/value head), 'mha'."""
    n_head: int = 1
    """Number of query heads (must be 1 for 'shga')."""
    attn_type: str = "vq"
    """'vq' (Transformer-VQ); baselines 'full' (softmax, unquantized), 'flash_quad', 'flash'."""
    reduction: str = "serial"
    """How the per-code cache is accumulated across blocks: 'serial', 'matmul' or 'assoc' (App. B/E)."""
    commit_coef: float = 1e-4
    """Commitment loss coefficient beta (Eq. 35)."""
    ema_rate: float = 0.99
    """Codebook EMA rate gamma."""
    dead_code_restart: int = 0
    """Re-seed codes unused for this many codebook updates from recent keys (0 = off)."""
    max_wavelength: float = 1e5
    """Maximum wavelength of every sinusoid table (App. C)."""
    dropsin: float = 0.0
    """Dropout on the relative-position sinusoids (p_dropsin)."""
    dropres: float = 0.0
    """Dropout on each GAU's residual branch (p_dropres)."""
    droplyr: float = 0.0
    """LayerDrop: probability of skipping a whole GAU in training (p_droplyr)."""
    abs_pos: bool = False
    """Add absolute ScaledSin position embeddings to the token embeddings (the paper's image models)."""
    final_norm: bool = False
    """RMS-normalize the residual stream before the output head (the paper's large models)."""
    tie_embeddings: bool = False
    """Share the output head with the token embedding (scaled down), as the paper's large models."""
    flash_chunk_len: int = 256
    """Chunk length of the 'flash' baseline's mixed-chunk attention."""

    def __post_init__(self):
        errors = []

        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                errors.append(f"{name} must be a positive integer, got {value!r}")

        for name in ("vocab_size", "d_model", "d_k", "d_v", "n_layers", "n_code", "block_len", "n_head",
                     "flash_chunk_len"):
            positive(name)
        if self.head_type not in HEAD_TYPES:
            errors.append(f"head_type must be one of {', '.join(HEAD_TYPES)}, got {self.head_type!r}")
        if self.attn_type not in ATTN_TYPES:
            errors.append(f"attn_type must be one of {', '.join(ATTN_TYPES)}, got {self.attn_type!r}")
        if self.reduction not in REDUCTIONS:
            errors.append(f"reduction must be one of {', '.join(REDUCTIONS)}, got {self.reduction!r}")
        if self.head_type == "shga" and self.n_head != 1:
            errors.append(f"head_type 'shga' has exactly one head; got n_head={self.n_head} (use 'mqa' or 'mha')")
        if isinstance(self.n_head, int) and self.n_head >= 1 and isinstance(self.d_v, int):
            if self.d_v % self.n_head != 0:
                errors.append(f"d_v={self.d_v} must be divisible by n_head={self.n_head}")
        for name in ("dropsin", "dropres", "droplyr"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                errors.append(f"{name} is a probability in [0, 1), got {value!r}")
        if not 0.0 < self.ema_rate < 1.0:
            errors.append(f"ema_rate must be in (0, 1), got {self.ema_rate!r}")
        if self.commit_coef < 0:
            errors.append(f"commit_coef must be >= 0, got {self.commit_coef!r}")
        if not isinstance(self.dead_code_restart, int) or self.dead_code_restart < 0:
            errors.append(f"dead_code_restart must be an integer >= 0 (0 = off), got {self.dead_code_restart!r}")
        if self.max_wavelength <= 1:
            errors.append(f"max_wavelength must be > 1, got {self.max_wavelength!r}")
        if isinstance(self.d_model, int) and self.d_model % 2 != 0:
            errors.append(f"d_model must be even (sinusoid tables pair sin and cos), got {self.d_model}")
        if errors:
            raise ValueError("invalid TransformerVQConfig: " + "; ".join(errors))

    @property
    def n_kv_head(self) -> int:
        """Number of key/value groups G: 1 for 'shga' and 'mqa', n_head for 'mha'."""
        return self.n_head if self.head_type == "mha" else 1

    @property
    def d_v_head(self) -> int:
        """Value width of one head."""
        return self.d_v // self.n_head

    def replace(self, **changes) -> "TransformerVQConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TransformerVQConfig":
        """Build from a dict, rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s): {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        return cls(**values)


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
    "small": TransformerVQConfig(
        vocab_size=256, d_model=256, d_k=64, d_v=512, n_layers=2, n_code=64, block_len=64, dropsin=0.1,
    ),
    "tiny": TransformerVQConfig(
        vocab_size=256, d_model=32, d_k=16, d_v=64, n_layers=1, n_code=8, block_len=8,
    ),
}


def preset(name: str, **overrides) -> TransformerVQConfig:
    """The preset ``name`` with ``overrides`` applied (e.g. ``preset("enwik8", n_layers=2)``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)
