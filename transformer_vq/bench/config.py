"""The sizes of each benchmark: one frozen dataclass per benchmark, whose fields are the ``tvq bench`` flags.

Each nests the model it measures (a :class:`~transformer_vq.config.TransformerVQConfig`, or a
:class:`~transformer_vq.config.LongVQConfig` for ``tvq bench longvq``: a preset plus overrides, whose fields are flags
too: ``--block-len``, ``--flash-chunk-len``), and says which of the model's fields its cells read
(:meth:`BenchConfig.cells`, :mod:`transformer_vq.bench.reads`): a model flag no cell reads is refused. Kept free of
torch so that ``tvq --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_vq.bench.reads import Cell, refuse_unread
from transformer_vq.config import (ATTN_TYPES, HEAD_TYPES, LONGVQ_PRESETS, OP_METHODS, PRECISIONS, PRESETS,
                                   TRAINING_ONLY_FIELDS, ConfigError, LongVQConfig, TransformerVQConfig, longvq_preset)
from transformer_vq.config.fields import check, fields_of, kinds, option

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

    @classmethod
    def base_model(cls, model):
        """The model a preset gives the benchmark, before the model flags: the preset itself (a benchmark whose
        cells set some of its fields overrides this)."""
        return model

    def cells(self) -> list[Cell]:
        """Each kind of cell the benchmark runs, as far as its model goes (:mod:`transformer_vq.bench.reads`)."""
        raise NotImplementedError

    def refuse_unread(self, given) -> None:
        """Refuse (:class:`~transformer_vq.config.ConfigError`) the model fields named in ``given`` (the flags the
        user gave) that no cell of this benchmark honors, naming each flag and why."""
        refuse_unread(self.model, self.cells(), given)


def _cell(model: dict, sets: dict[str, str], unread: dict[str, str]) -> Cell:
    """A :class:`Cell` running ``model`` (its fields, those the benchmark sets included), whose fields ``sets`` are set
    by the benchmark's flags and so never read from the model's own flags, and which never reads ``unread``."""
    return Cell(context=model, sets=sets,
                unread={**{name: f"{flag} sets it for each cell" for name, flag in sets.items()}, **unread})


def _per_model(cfg, name: str, model):
    """The model of cell ``name`` (of ``--models``), built by ``model()``: a combination the model refuses is refused
    up front, naming the cell, rather than failing that cell's process."""
    try:
        return model()
    except ConfigError as err:
        if err.cls is not type(cfg.model) or not err.problems:
            check(cfg, [("models", f"{name}: {err}")])  # raises, naming the flag
        # a problem of one model field is that of its flag (--reduction), not of --models with the model class's name;
        # the cell says where it arose
        check(cfg, [("models", f"{name}: {text}") if field is None else (f"model.{field}", f"{text} (in cell {name} "
                                                                                           f"of --models)")
                    for field, text in err.problems])


def _common(seed_help: str, budget_s: float, isolate_help: str):
    return dict(
        precision=option("float32", "float32 or bfloat16.", choices=PRECISIONS),
        budget_s=option(budget_s, "Skip a cell whose estimated time exceeds this many seconds.", min=0.0,
                        min_open=True),
        isolate=option(True, f"{isolate_help} With --no-isolate the cells share this process: on a CPU a cell then "
                             f"reuses the heap of the ones before, so no memory is reported ('-')."),
        mem_limit_gib=option(16.0, "Address-space limit of each cell's process, in GiB (0: none).", min=0.0),
        retain_host_memory=option(True, "On a CPU, keep freed memory for reuse in each cell's process, as tvq "
                                        "train does (--no-retain-host-memory: glibc's default, which maps and "
                                        "page-faults tensors above 32 MiB afresh each call)."),
        seed=option(0, seed_help, min=0),
    )


def _device(what: str):
    return option("cpu", f"Where {what} runs: 'cpu' or 'cuda'.", choices=BENCH_DEVICES)


OP_METHOD_MODELS = {
    **{m: {"attn_type": "vq", "causal": True} for m in ("vq-serial", "vq-matmul", "vq-assoc", "vq-triton", "vq-qk")},
    "sdpa": {"attn_type": "full", "causal": True}, "full": {"attn_type": "full", "causal": True},
    "flash": {"attn_type": "flash", "causal": True}, "flash_quad": {"attn_type": "flash_quad", "causal": True},
    **{m: {"attn_type": "vq", "causal": False} for m in ("vq-bidir", "vq-qk-bidir")},
    "sdpa-bidir": {"attn_type": "full", "causal": False},
}
"""Each method of ``tvq bench op`` as the model fields it stands for (SDPA: exact softmax, as ``full``)."""
OP_READS = ("n_head", "head_type", "d_k", "d_v", "n_code", "block_len", "flash_chunk_len")
"""The model fields the methods of ``tvq bench op`` read (the sizes of their inputs); every other is refused."""

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

    def cells(self) -> list[Cell]:
        """One kind per method: the method decides the attention (attn_type, causal); only the sizes are read."""
        why = (f"tvq bench op times the methods named by --methods on inputs of the layer's sizes "
               f"({', '.join(OP_READS)}); this field is not read by them")
        unread = {name: why for name in fields_of(TransformerVQConfig) if name not in OP_READS}
        return [_cell({**self.model.to_dict(), **OP_METHOD_MODELS[m]}, dict.fromkeys(OP_METHOD_MODELS[m], "--methods"),
                      unread) for m in self.methods]


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
        for name in self.models:
            self.cell_model(name)

    @classmethod
    def base_model(cls, model: TransformerVQConfig) -> TransformerVQConfig:
        """A preset with head_type 'mha': each cell sets its own head_type (and one head for shga), so a preset's
        single-head 'shga' must not refuse the --n-head of the mqa/mha cells."""
        return model.replace(head_type="mha")

    def cell_model(self, name: str) -> TransformerVQConfig:
        """The model ``attn_type/head_type`` of ``--models`` at the benchmark's sizes."""
        attn_type, head_type = name.split("/")
        return _per_model(self, name, lambda: self.model.replace(
            attn_type=attn_type, head_type=head_type, n_head=1 if head_type == "shga" else self.model.n_head))

    def cells(self) -> list[Cell]:
        """One kind per model of ``--models``, which sets its attn_type and head_type (and one head for shga)."""
        cells = []
        for model in map(self.cell_model, self.models):
            unread = {}
            if model.head_type == "shga":
                unread["n_head"] = "a shga model has one head, and --models names no mqa or mha model"
            if not model.causal:  # a causal model's mask_rate is refused where it applies: only to encoders
                unread["mask_rate"] = "tvq bench train times next-token steps, which mask no token"
            cells.append(_cell(model.to_dict(), {"attn_type": "--models", "head_type": "--models"}, unread))
        return cells


_DECODE = _common("Seed of the weights, the prompt and the sampling.", 300.0,
                  "Run each cell in its own process (out-of-memory reported, not fatal).")


@dataclass(frozen=True)
class DecodeBenchConfig(BenchConfig):
    """Model and sizes of ``tvq bench decode``."""

    model: TransformerVQConfig = option(factory=lambda: BENCH_MODEL,
                                        help="The model; each of --models sets its attn_type.")
    contexts: tuple[int, ...] = option((1024, 8192, 65536), "Context lengths read before generating.", **LENGTHS)
    models: tuple[str, ...] = option(("vq", "full"), "attn_type of each model (the rest, the head type too, is the "
                                                     "model's: --head-type ...).", choices=ATTN_TYPES)
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
        encoder = ("tvq bench decode generates tokens, and an encoder (causal false) has no decoding state to "
                   "generate from; leave out --no-causal")
        check(self, [(None, encoder)] if not self.model.causal else [])
        for name in self.models:
            self.cell_model(name)

    def cell_model(self, attn_type: str) -> TransformerVQConfig:
        """The model with attention ``attn_type`` of ``--models`` at the benchmark's sizes."""
        return _per_model(self, attn_type, lambda: self.model.replace(attn_type=attn_type))

    def cells(self) -> list[Cell]:
        """One kind per attn_type of ``--models``; decoding trains nothing, so the fields that act only in training
        are not read (``reduction`` and ``attn_backend`` are training-only too, but the prompt is read with them)."""
        why = "tvq bench decode trains nothing, and this field acts only in training"
        unread = {name: why for name in TRAINING_ONLY_FIELDS - {"reduction", "attn_backend"}}
        return [_cell(self.cell_model(name).to_dict(), {"attn_type": "--models"}, unread) for name in self.models]


_LONGVQ = _common("Seed of the weights and the embeddings.", 120.0, "Run each cell in its own process (peak memory "
                                                                   "per cell; out-of-memory reported, not fatal).")
LONGVQ_LAYERS = ("longvq", "longvq-relu2", "transformer", "transformer-dense")
LONGVQ_BASELINES = ("transformer", "transformer-dense")
"""The full-attention blocks of ``tvq bench longvq`` (fused, then scores built whole): what the LongVQ kinds are
compared with, a group of ratios each, in this order."""
LONGVQ_SCORING = {"longvq": "softmax", "longvq-relu2": "relu2"}
"""The scoring each LongVQ block kind of ``tvq bench longvq`` times (``--layers`` decides it, not ``--scoring``)."""
TRANSFORMER_READS = ("d_model", "d_qk", "d_ffn", "dropout", "causal")
"""The LongVQ model fields the full-attention block of ``tvq bench longvq`` is built from."""
ONE_BLOCK_UNREAD = {
    **dict.fromkeys(("vocab_size", "n_layers", "n_classes"), "tvq bench longvq times one block on random embeddings, "
                                                             "which this field does not change"),
    "commit_coef": "it weighs the commitment loss of a whole model; the benchmark adds one block's unweighted",
    # dead_code_restart is read: in training mode the block keeps recent keys for it, part of the timed step
    "ema_rate": "it acts in codebook updates, which the timed block does not make",
}
"""The LongVQ model fields one LongVQ block, as ``tvq bench longvq`` times it, does not read."""


@dataclass(frozen=True)
class LongVQBenchConfig(BenchConfig):
    """Sizes of ``tvq bench longvq``: one LongVQ block against one full-attention block of the same widths."""

    model: LongVQConfig = option(factory=lambda: LONGVQ_BENCH_PRESETS["lra-text"],
                                 help="The block's widths (default: lra-text, Mega's LRA Text widths with codebook "
                                      "512, one encoder block); the transformer block takes d_model, d_qk (head "
                                      "width) and d_ffn from it.")
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

    def cells(self) -> list[Cell]:
        """One kind per block of ``--layers``: a LongVQ block with the scoring its kind names, or a full-attention
        block built from a few of the widths."""
        scoring = ", ".join(f"{kind}: {s}" for kind, s in LONGVQ_SCORING.items())
        sets = {"scoring": "--layers"}
        unread = {"scoring": f"--layers sets it for each block ({scoring})", **ONE_BLOCK_UNREAD}
        transformer = {name: f"the {', '.join(LONGVQ_BASELINES)} blocks read only {', '.join(TRANSFORMER_READS)}"
                       for name in fields_of(LongVQConfig) if name not in TRANSFORMER_READS}
        return [_cell({**self.model.to_dict(), "scoring": LONGVQ_SCORING[kind]}, sets, unread)
                if kind in LONGVQ_SCORING else _cell(self.model.to_dict(), {}, transformer) for kind in self.layers]
