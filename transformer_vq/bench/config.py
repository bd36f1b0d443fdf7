"""The sizes of each benchmark: one frozen dataclass per benchmark, whose fields are the ``tvq bench`` flags.

Each nests the model it measures (a :class:`~transformer_vq.config.TransformerVQConfig`, or a
:class:`~transformer_vq.config.LongVQConfig` for ``tvq bench longvq``: a preset plus overrides, whose fields are flags
too: ``--block-len``, ``--flash-chunk-len``). Kept free of torch so that ``tvq --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_vq.config import (ATTN_TYPES, HEAD_TYPES, LONGVQ_PRESETS, OP_METHODS, PRECISIONS, PRESETS,
                                   LongVQConfig, TransformerVQConfig, longvq_preset)
from transformer_vq.config.fields import check, kinds, option

# The small model of the training and decoding benchmarks (minutes on a CPU); its dropouts are off.
BENCH_MODEL = PRESETS["small"].replace(n_layers=1, n_code=128, block_len=128, flash_chunk_len=128, dropsin=0.0)
# The LongVQ presets as the one encoder block that ``tvq bench longvq`` times (dropout off), and ``lra-text``, its
# default: the paper's speed figure is LRA Text at 4k tokens, whose widths its Table 7 (empty in our copy) would give;
# LongVQ follows Mega, so these are Mega's LRA Text widths (d_model 128, z 64, v 256, FFN 256, h 16, scale norm), the
# paper's codebook size (512, "in all cases") and Mega-chunk's chunk length 128 as the block length.
LONGVQ_BENCH_PRESETS = {
    **{name: longvq_preset(name, n_layers=1, n_classes=2, causal=False, dropout=0.0) for name in LONGVQ_PRESETS},
    "lra-text": LongVQConfig(d_model=128, d_qk=64, d_v=256, d_ffn=256, n_layers=1, ema_dim=16, n_code=512,
                             block_len=128, norm="scale", n_classes=2, causal=False, dropout=0.0),
}
LENGTHS = dict(min=1, k_suffix=True)
BENCH_DEVICES = ("cpu", "cuda")
# each model class a benchmark may nest -> its presets (``--preset``)
MODEL_PRESETS = {TransformerVQConfig: PRESETS, LongVQConfig: LONGVQ_BENCH_PRESETS}


class BenchConfig:
    """What every benchmark config shares: its nested model, rebuilt from JSON by :meth:`from_dict`."""

    @classmethod
    def model_class(cls) -> type:
        """The class of the nested model: the declared type of the ``model`` field."""
        return kinds(cls)["model"].base

    @classmethod
    def from_dict(cls, values: dict):
        """Rebuild from ``dataclasses.asdict`` output (the ``config`` of a result, or of a cell's process)."""
        from transformer_vq.config.fields import build

        return build(cls, {**values, "model": cls.model_class().from_dict(values["model"])}, "bench")


def _common(seed_help: str, budget_s: float, isolate_help: str):
    return dict(
        precision=option("float32", "float32 or bfloat16.", choices=PRECISIONS),
        budget_s=option(budget_s, "Skip a cell whose estimated time exceeds this many seconds.", min=0.0,
                        min_open=True),
        isolate=option(True, isolate_help),
        mem_limit_gib=option(16.0, "Address-space limit of each cell's process, in GiB (0: none).", min=0.0),
        retain_host_memory=option(True, "On a CPU, keep freed memory for reuse in each cell's process, as tvq "
                                        "train does (--no-retain-host-memory: glibc's default, which maps and "
                                        "page-faults tensors above 32 MiB afresh each call)."),
        seed=option(0, seed_help, min=0),
    )


def _device(what: str):
    return option("cpu", f"Where {what} runs: 'cpu' or 'cuda'.", choices=BENCH_DEVICES)


_OP = _common("Seed of the random inputs.", 120.0, "Run each cell in its own process (peak memory per cell; "
                                                   "out-of-memory reported, not fatal).")


@dataclass(frozen=True)
class OpBenchConfig(BenchConfig):
    """Sizes of ``tvq bench op`` (default model: the paper's enwik8 GAU, Dk 128, Dv 1536, S 512, L 512)."""

    model: TransformerVQConfig = option(factory=lambda: PRESETS["enwik8"],
                                        help="The layer's sizes: H = n_head, G = its key/value groups, Dk, Dv, S, "
                                             "L, FLASH chunk C = flash_chunk_len.")
    lengths: tuple[int, ...] = option((2048, 8192, 32768, 131072), "Sequence lengths T.", **LENGTHS)
    methods: tuple[str, ...] = option(("vq-serial", "vq-matmul", "vq-assoc", "sdpa", "full", "flash"),
                                      "Methods: causal vq-serial, vq-matmul, vq-assoc, vq-triton (fused kernels; a "
                                      "GPU's), vq-qk (queries quantized "
                                      "too), sdpa (no bias), full, flash, flash_quad; non-causal (no bias) "
                                      "vq-bidir, vq-qk-bidir, sdpa-bidir.", choices=OP_METHODS)
    batch_size: int = option(1, "Batch size B.", min=1)
    precision: str = _OP["precision"]
    device: str = option("cpu", "Where the operator runs: 'cpu' or 'cuda' (the matmul yardstick runs there too).",
                         choices=BENCH_DEVICES)
    repeats: int = option(3, "Timed runs per cell, after one warm-up (median reported); cells estimated above 5 s "
                             "run once.", min=1)
    backward: bool = option(True, "Also time forward + backward (gradients of q, k, v and the bias).")
    torch_compile: bool = option(False, "Time every method under torch.compile (fixed shapes, compiled in an "
                                        "untimed warm-up): the elementwise passes fused, as tvq train --torch-compile "
                                        "runs them.")
    budget_s: float = _OP["budget_s"]
    isolate: bool = _OP["isolate"]
    mem_limit_gib: float = _OP["mem_limit_gib"]
    retain_host_memory: bool = _OP["retain_host_memory"]
    seed: int = _OP["seed"]
    paired: tuple[int, ...] = option((), "Lengths at which all methods are also timed in one process, interleaved "
                                         "round by round (forward only): speedups robust to a load that changes "
                                         "between cells.", allow_empty=True, **LENGTHS)

    def __post_init__(self):
        check(self)


_TRAIN = _common("Seed of the weights and the tokens.", 120.0, "Run each cell in its own process (peak memory "
                                                              "per cell; out-of-memory reported, not fatal).")


@dataclass(frozen=True)
class TrainBenchConfig(BenchConfig):
    """Model and sizes of ``tvq bench train`` (a small model by default, minutes on a CPU)."""

    model: TransformerVQConfig = option(factory=lambda: BENCH_MODEL.replace(head_type="mha", n_head=4),
                                        help="The model; each of --models sets its attn_type and head_type "
                                             "(shga with one head, mqa/mha with n_head).")
    lengths: tuple[int, ...] = option((2048, 8192, 32768), "Sequence lengths T (one window of T tokens per step).",
                                      **LENGTHS)
    models: tuple[str, ...] = option(("vq/shga", "vq/mqa", "vq/mha", "full/shga", "full/mqa", "full/mha",
                                      "flash/shga", "flash_quad/shga"), "attn_type/head_type pairs.")
    batch_size: int = option(1, "Sequences per step.", min=1)
    precision: str = _TRAIN["precision"]
    device: str = _device("the model (and its training step, bfloat16 as autocast)")
    repeats: int = option(3, "Timed steps per cell after one warm-up step (median reported); cells estimated "
                             "above 10 s run once.", min=1)
    budget_s: float = _TRAIN["budget_s"]
    isolate: bool = _TRAIN["isolate"]
    mem_limit_gib: float = _TRAIN["mem_limit_gib"]
    retain_host_memory: bool = _TRAIN["retain_host_memory"]
    seed: int = _TRAIN["seed"]
    interleaved: bool = option(False, "Run every (model, T) in one process, one step of each per round, so that "
                                      "all of them are timed under the same load (peak memory is then per run, "
                                      "and a cell out of memory is caught in-process).")

    def __post_init__(self):
        bad = [m for m in self.models if m.partition("/")[0] not in ATTN_TYPES
               or m.partition("/")[2] not in HEAD_TYPES]
        check(self, [("models", f"must be attn_type/head_type pairs with attn_type in {', '.join(ATTN_TYPES)} "
                                f"and head_type in {', '.join(HEAD_TYPES)}, got {m!r}") for m in bad[:1]])


_DECODE = _common("Seed of the weights, the prompt and the sampling.", 300.0,
                  "Run each cell in its own process (out-of-memory reported, not fatal).")


@dataclass(frozen=True)
class DecodeBenchConfig(BenchConfig):
    """Model and sizes of ``tvq bench decode``."""

    model: TransformerVQConfig = option(factory=lambda: BENCH_MODEL,
                                        help="The model; each of --models sets its attn_type.")
    contexts: tuple[int, ...] = option((1024, 8192, 65536), "Context lengths read before generating.", **LENGTHS)
    models: tuple[str, ...] = option(("vq", "full"), "attn_type of each model (head type shga).",
                                     choices=ATTN_TYPES)
    new_tokens: int = option(16, "Tokens generated per cell; the median step time is reported.", min=1)
    prompt_chunk: int = option(8192, "Prompt tokens per call while reading the context (the state is carried "
                                     "between calls).", min=1)
    precision: str = _DECODE["precision"]
    device: str = _device("the model (its weights and the carried state)")
    budget_s: float = _DECODE["budget_s"]
    isolate: bool = _DECODE["isolate"]
    mem_limit_gib: float = _DECODE["mem_limit_gib"]
    retain_host_memory: bool = _DECODE["retain_host_memory"]
    seed: int = _DECODE["seed"]

    def __post_init__(self):
        check(self)


_LONGVQ = _common("Seed of the weights and the embeddings.", 120.0, "Run each cell in its own process (peak memory "
                                                                   "per cell; out-of-memory reported, not fatal).")
LONGVQ_LAYERS = ("longvq", "longvq-relu2", "transformer", "transformer-dense")
LONGVQ_BASELINES = ("transformer", "transformer-dense")
"""The full-attention blocks of ``tvq bench longvq`` (fused, then scores built whole): what the LongVQ kinds are
compared with, a group of ratios each, in this order."""


@dataclass(frozen=True)
class LongVQBenchConfig(BenchConfig):
    """Sizes of ``tvq bench longvq``: one LongVQ block against one full-attention block of the same widths."""

    model: LongVQConfig = option(factory=lambda: LONGVQ_BENCH_PRESETS["lra-text"],
                                 help="The block's widths (default: lra-text, Mega's LRA Text widths with codebook 512, "
                                      "one encoder block); the transformer block takes d_model, d_qk (head width) and "
                                      "d_ffn from it.")
    lengths: tuple[int, ...] = option((4096, 8192, 16384), "Sequence lengths T.", **LENGTHS)
    layers: tuple[str, ...] = option(LONGVQ_LAYERS, "Blocks: longvq (softmax), longvq-relu2, transformer (full "
                                                    "softmax attention, fused kernel), transformer-dense (the same "
                                                    "with its T x T scores built whole: the paper's baseline).",
                                     choices=LONGVQ_LAYERS)
    batch_size: int = option(1, "Batch size B.", min=1)
    precision: str = _LONGVQ["precision"]
    repeats: int = option(3, "Timed runs per cell, after one warm-up (median reported); cells estimated above 5 s "
                             "run once.", min=1)
    backward: bool = option(True, "Also time forward + backward (gradients of the weights and the input).")
    budget_s: float = _LONGVQ["budget_s"]
    isolate: bool = _LONGVQ["isolate"]
    mem_limit_gib: float = _LONGVQ["mem_limit_gib"]
    retain_host_memory: bool = _LONGVQ["retain_host_memory"]
    seed: int = _LONGVQ["seed"]

    def __post_init__(self):
        m = self.model
        problems = [
            "the LongVQ block must be an encoder (--no-causal), as the transformer block it is compared with"
            if m.causal else None,
            f"the transformer block splits d_model into heads of width d_qk: d_model must be divisible by d_qk, "
            f"got d_model={m.d_model}, d_qk={m.d_qk}" if "transformer" in self.layers and m.d_model % m.d_qk else None,
        ]
        check(self, [(None, text) for text in problems if text])
