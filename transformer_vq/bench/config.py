"""The sizes of each benchmark: one frozen dataclass per benchmark, whose fields are the ``tvq bench`` flags.

Kept free of torch so that ``tvq --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

OP_METHODS = ("vq-serial", "vq-matmul", "vq-assoc", "sdpa", "full", "flash", "flash_quad")
ATTN_TYPES = ("vq", "full", "flash_quad", "flash")
HEAD_TYPES = ("shga", "mqa", "mha")
DTYPES = ("float32", "bfloat16")


def _check_common(cfg, errors: list[str]) -> None:
    if cfg.dtype not in DTYPES:
        errors.append(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.budget_s <= 0:
        errors.append(f"budget_s must be > 0, got {cfg.budget_s}")
    if errors:
        raise ValueError(f"invalid {type(cfg).__name__}: " + "; ".join(errors))


@dataclass(frozen=True)
class OpBenchConfig:
    """Sizes of ``tvq bench op`` (defaults: the paper's GAU, Dk 128, Dv 1536, S 512, L 512)."""

    lengths: tuple[int, ...] = (2048, 8192, 32768, 131072)
    """Sequence lengths T."""
    methods: tuple[str, ...] = ("vq-serial", "vq-matmul", "vq-assoc", "sdpa", "full", "flash")
    """Methods: vq-serial, vq-matmul, vq-assoc, sdpa (no bias), full, flash, flash_quad."""
    batch: int = 1
    """Batch size B."""
    n_head: int = 1
    """Query heads H."""
    n_group: int = 1
    """Key/value groups G (divides H)."""
    d_k: int = 128
    """Key width Dk."""
    d_v: int = 1536
    """Value width Dv."""
    n_code: int = 512
    """Codebook size S."""
    block_len: int = 512
    """Block length L."""
    chunk_len: int = 256
    """FLASH chunk length C."""
    dtype: str = "float32"
    """float32 or bfloat16."""
    repeats: int = 3
    """Timed runs per cell, after one warm-up (median reported); cells estimated above 5 s run once."""
    backward: bool = True
    """Also time forward + backward (gradients of q, k, v and the bias)."""
    budget_s: float = 120.0
    """Skip a cell whose estimated forward time (from the same method at the previous length) exceeds this."""
    isolate: bool = True
    """Run each cell in its own process (peak memory per cell; out-of-memory reported, not fatal)."""
    mem_limit_gib: float = 16.0
    """Address-space limit of each cell's process, in GiB (0: none)."""
    seed: int = 0
    """Seed of the random inputs."""
    paired: tuple[int, ...] = ()
    """Lengths at which all methods are also timed in one process, interleaved round by round (forward only): speedups
    robust to a load that changes between cells."""

    def __post_init__(self):
        errors = [f"unknown method {m!r}; choose from {', '.join(OP_METHODS)}" for m in self.methods
                  if m not in OP_METHODS]
        _check_common(self, errors)


@dataclass(frozen=True)
class TrainBenchConfig:
    """Model and sizes of ``tvq bench train`` (a small model by default, minutes on a CPU)."""

    lengths: tuple[int, ...] = (2048, 8192, 32768)
    """Sequence lengths T (one window of T tokens per step)."""
    models: tuple[str, ...] = ("vq/shga", "vq/mqa", "vq/mha", "full/shga", "full/mqa", "full/mha", "flash/shga",
                               "flash_quad/shga")
    """attn_type/head_type pairs."""
    batch: int = 1
    """Sequences per step."""
    d_model: int = 256
    """Residual width."""
    d_k: int = 64
    """Query/key width per head."""
    d_v: int = 512
    """Total value width."""
    n_layers: int = 1
    """Layers of two GAUs each."""
    n_code: int = 128
    """Codebook size S."""
    block_len: int = 128
    """Block length L."""
    n_head: int = 4
    """Query heads of mqa/mha models (shga has one)."""
    flash_chunk_len: int = 128
    """FLASH chunk length."""
    reduction: str = "serial"
    """Cache reduction of VQ models: serial, matmul or assoc."""
    dtype: str = "float32"
    """float32, or bfloat16 (CPU autocast)."""
    repeats: int = 3
    """Timed steps per cell after one warm-up step (median reported); cells estimated above 10 s run once."""
    budget_s: float = 120.0
    """Skip a cell whose estimated step time exceeds this."""
    isolate: bool = True
    """Run each cell in its own process (peak memory per cell; out-of-memory reported, not fatal)."""
    mem_limit_gib: float = 16.0
    """Address-space limit of each cell's process, in GiB (0: none)."""
    seed: int = 0
    """Seed of the weights and the tokens."""
    interleaved: bool = False
    """Run every (model, T) in one process, one step of each per round, so that all of them are timed under the same
    load (peak memory is then per run, and a cell out of memory is caught in-process)."""

    def __post_init__(self):
        errors = []
        for model in self.models:
            attn, _, head = model.partition("/")
            if attn not in ATTN_TYPES or head not in HEAD_TYPES:
                errors.append(f"model {model!r} must be attn_type/head_type with attn_type in {', '.join(ATTN_TYPES)} "
                              f"and head_type in {', '.join(HEAD_TYPES)}")
        _check_common(self, errors)


@dataclass(frozen=True)
class DecodeBenchConfig:
    """Model and sizes of ``tvq bench decode``."""

    contexts: tuple[int, ...] = (1024, 8192, 65536)
    """Context lengths read before generating."""
    models: tuple[str, ...] = ("vq", "full")
    """attn_type of each model (head type shga)."""
    new_tokens: int = 16
    """Tokens generated per cell; the median step time is reported."""
    d_model: int = 256
    """Residual width."""
    d_k: int = 64
    """Query/key width."""
    d_v: int = 512
    """Value width."""
    n_layers: int = 1
    """Layers of two GAUs each."""
    n_code: int = 128
    """Codebook size S."""
    block_len: int = 128
    """Block length L."""
    flash_chunk_len: int = 128
    """FLASH chunk length."""
    prompt_chunk: int = 8192
    """Prompt tokens per call while reading the context (the state is carried between calls)."""
    dtype: str = "float32"
    """float32 or bfloat16 (weights and activations)."""
    budget_s: float = 300.0
    """Skip a cell whose estimated prompt time exceeds this."""
    isolate: bool = True
    """Run each cell in its own process (out-of-memory reported, not fatal)."""
    mem_limit_gib: float = 16.0
    """Address-space limit of each cell's process, in GiB (0: none)."""
    seed: int = 0
    """Seed of the weights, the prompt and the sampling."""

    def __post_init__(self):
        errors = [f"unknown model {m!r}; choose from {', '.join(ATTN_TYPES)}" for m in self.models
                  if m not in ATTN_TYPES]
        _check_common(self, errors)
