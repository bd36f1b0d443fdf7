"""Training configuration: how to train (data, batches, optimizer, schedule, checkpoints, logging), and the
run config that pairs it with the model. Frozen and validated; saved as JSON with every checkpoint."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from transformer_vq.config.arch import DEFAULT_ARCH, arch_of, find_arch, run_arch
from transformer_vq.config.choices import DEVICES, OPTIMIZERS, PARALLELS, PRECISIONS
from transformer_vq.config.jobs import TEXT, eval_tokens_problem, threads_option
from transformer_vq.config.applies import Above
from transformer_vq.config.fields import ConfigError, build, check, option
from transformer_vq.config.longvq import LongVQConfig
from transformer_vq.config.model import PRESETS, TransformerVQConfig

ADAMW = {"optimizer": ("adamw",)}
"""Where the gradient-norm clip applies: adafactor clips its updates instead."""

# The paper's maximum learning rates (App. C.2), used when `lr` is left unset.
PAPER_LR = {"adamw": 4e-4, "adafactor": 1e-2}


def name_problem(name) -> str | None:
    """Why a run name cannot name a directory under runs/ (None when it can)."""
    if isinstance(name, str) and name and name not in (".", "..") and "/" not in name and "\\" not in name \
            and "\0" not in name:
        return None
    return f"must name one directory (not empty, '.' or '..', without '/'), got {name!r}"


def retain_host_memory_option():
    """The ``retain_host_memory`` field of a training config (:mod:`transformer_vq.hostmem`), shared by the trainers."""
    return option(True, "On a CPU, keep freed memory for reuse instead of returning it to the system (glibc): "
                        "tensors above 32 MiB are otherwise mapped and page-faulted afresh every step, which makes "
                        "long sequences train 1.5-1.7x slower per token; see docs/training.md.",
                  applies={"device": ("auto", "cpu")})


FSDP_ADAFACTOR = ("'adafactor' does not run with parallel 'fsdp': its factored second moment updates statistics of "
                  "whole rows and columns of each matrix in place, which FSDP shards across workers (PyTorch "
                  "refuses such in-place updates of sharded tensors); use --optimizer adamw with --parallel fsdp, "
                  "or --parallel ddp with adafactor")


MAX_COLLECTIVE_TIMEOUT = 1e6
"""11.6 days: far above any wait, far below the durations that ``timedelta`` and the backends cannot hold."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train: data, batches, optimizer, schedule, checkpoints, logging.

    The defaults train the ``small`` model on the Shakespeare corpus in about five minutes on a
    2-core CPU (see docs/training.md).
    """

    name: str = option("default", "Run name; the run directory defaults to runs/<name>.",
                       applies={"run_dir": (None,)})
    run_dir: str | None = option(None, "Where checkpoints, metrics and TensorBoard events go (default "
                                       "runs/<name>).")
    data: str = option("shakespeare", "Corpus name for transformer_vq.data.load_corpus ('shakespeare', 'text', "
                                      "'enwik8', ...).", defines_data=True)
    data_path: str | None = option(None, "Local file or directory of the corpus (required for 'text'; with "
                                         "another corpus, its downloaded copy). Needs --data.")
    data_options: dict = option(factory=dict, help="Keyword options of the corpus loader (e.g. tokenizer=PATH "
                                "for pg19); repeatable KEY=VALUE.", flag="data-option", defines_data=True)
    seed: int = option(0, "Seeds the initialization, dropout and the data order.", min=0, defines_data=True)
    batch_size: int = option(8, "Global batch size in sequences (summed over data-parallel workers).", min=1)
    # 2,048, not 256: validation resets the state every seq_len tokens (the trained history), so seq_len is also the
    # longest history the model is judged on; a VQ model trained with caches of at most two blocks was hurt by the far
    # larger cache of a whole-stream evaluation (docs/quality.md, "Why the cache hurt"). A longer sequence costs VQ
    # nothing per step (one window of update_len each).
    seq_len: int = option(2048, "Tokens per sequence; the operator state is reset at the start of every batch "
                                "of sequences.", min=1, defines_data=True)
    update_len: int = option(128, "Backprop window W: one optimizer step per window of this many tokens (a "
                                  "multiple of block_len).", min=1)
    steps: int = option(800, "Number of optimizer steps (windows) to train for.", min=1)
    optimizer: str = option("adamw", "'adamw' or 'adafactor' (paper settings, App. C.2).", choices=OPTIMIZERS)
    lr: float | None = option(2e-3, "Peak learning rate. The default suits the small CPU models; none = the "
                                    "paper's value for the optimizer (4e-4 for adamw, 1e-2 for adafactor, App. "
                                    "C.2), meant for its 190M-1.3B models.", min=0.0, min_open=True)
    weight_decay: float = option(0.0, "Decoupled weight decay, applied only to parameters with more than one "
                                      "dimension.", min=0.0)
    warmup_steps: int = option(50, "Linear warmup steps, then cosine decay (a run of no more steps ends in its "
                                   "warmup, and its start says so).", min=0)
    final_lr_ratio: float = option(0.1, "The cosine schedule ends at this fraction of the peak learning rate "
                                        "(the paper decays 10x).", min=0.0, max=1.0)
    grad_clip: float = option(0.1, "Global gradient-norm clip for adamw (0 = off); adafactor clips its updates "
                                   "instead (d = 1).", min=0.0, applies=ADAMW)
    precision: str = option("float32", "'float32' or 'bfloat16' (autocast of the computation, parameters stay "
                                       "float32).", choices=PRECISIONS)
    device: str = option("auto", "'auto' (cuda when available), 'cpu' or 'cuda'.", choices=DEVICES)
    parallel: str = option("ddp", "How torchrun workers share the model: 'ddp' (a full copy each) or 'fsdp' (weights, "
                                  "gradients and optimizer state sharded; also one process without torchrun); see "
                                  "docs/distributed.md.", choices=PARALLELS)
    context_parallel: int = option(1, "Split every sequence along time over this many torchrun workers (context "
                                      "parallelism of VQ attention; a divisor of the worker count, the rest share "
                                      "batches as data-parallel groups); see docs/distributed.md.", min=1)
    collective_timeout: float | None = option(
        None, "Seconds a torchrun worker waits in a collective (gradients, losses, checkpoints) for the others "
        "before it stops with an error (none: the backend's own, 30 minutes for gloo, 10 for NCCL): a worker that "
        "stalls (stopped, hung) holds the others this long; keep it above a worker's rightful delays (a first "
        "compilation, a long save); see docs/distributed.md.", min=0.0, min_open=True, max=MAX_COLLECTIVE_TIMEOUT)
    torch_compile: bool = option(False, "Compile every gated attention unit with torch.compile (fused elementwise "
                                        "work; the first steps and the final evaluation wait for compilation); see "
                                        "docs/training.md.")
    pack: bool = option(False, "Packed documents: a sequence holds the corpus's documents (Shakespeare's works, a "
                               "text directory's files, PG-19's books) one after another, and no token attends to "
                               "or is predicted from another document; see docs/training.md.")
    threads: int = threads_option()
    retain_host_memory: bool = retain_host_memory_option()
    log_every: int = option(10, "Print a line every this many steps when not on a terminal (metrics.jsonl gets "
                                "every step).", min=1)
    eval_every: int = option(0, "Evaluate on the validation split every this many steps (0 = only at the "
                                "end).", min=0)
    eval_tokens: int = option(0, "Validation tokens per evaluation (0 = the whole split).", min=0)
    eval_streams: int = option(16, "Evaluation splits the data into this many contiguous streams run as one "
                                   "batch, state carried (an encoder: windows per forward call, memory only).",
                               min=1)
    ckpt_every: int = option(200, "Save a checkpoint every this many steps (and always at the end).", min=1)
    keep_ckpts: int = option(3, "How many most recent checkpoints to keep.", min=1)
    max_nonfinite: int = option(5, "Stop when this many steps in a row have a non-finite loss or gradient.",
                                min=1)
    sample_tokens: int = option(300, "Tokens of text to sample at the end of training (0 = none; causal models of "
                                     "text: an image model's samples are tvq sample's PNG files).", min=0,
                                applies={"causal": (True,), **TEXT}, off=0)
    sample_prompt: str = option("\n", "Prompt of the end-of-training sample.",
                                applies={"causal": (True,), "sample_tokens": Above(0), **TEXT})

    def __post_init__(self):
        extra = [("name", name_problem(self.name)) if name_problem(self.name) else None]
        if isinstance(self.seq_len, int) and isinstance(self.update_len, int) and self.update_len >= 1 \
                and self.seq_len % self.update_len != 0:
            multiple = max(1, self.seq_len // self.update_len) * self.update_len
            extra.append(("seq_len", f"must be a multiple of update_len={self.update_len} (e.g. {multiple}), "
                                     f"got {self.seq_len}"))
        extra.append(eval_tokens_problem("eval_tokens", self.eval_tokens))
        if self.optimizer == "adafactor" and self.parallel == "fsdp":
            extra.append(("optimizer", FSDP_ADAFACTOR))
        check(self, extra)

    @property
    def peak_lr(self) -> float:
        """The learning rate after warmup (the paper's default for the optimizer when unset)."""
        return self.lr if self.lr is not None else PAPER_LR[self.optimizer]

    @property
    def windows_per_batch(self) -> int:
        """Optimizer steps per batch of sequences (seq_len / update_len)."""
        return self.seq_len // self.update_len

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        """The fields as plain values (tuples stay tuples; JSON writes them as lists)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs: the model and how to train it. Saved as JSON with every checkpoint, with the
    architecture (:attr:`arch`) that says which config class the model section is."""

    model: TransformerVQConfig | LongVQConfig = option(factory=lambda: PRESETS["small"],
                                                       help="The model (its class is the architecture).")
    train: TrainConfig = option(factory=TrainConfig, help="How to train it.")

    def __post_init__(self):
        arch_of(self.model)  # refuses a model config of no language-model architecture
        if isinstance(self.model, LongVQConfig) and self.model.n_classes != 0:
            raise ConfigError(f"a language-model run needs n_classes 0, got {self.model.n_classes}; a LongVQ "
                              f"classifier trains with tvq classify train")
        check_compatible(self.model, self.train)

    @property
    def arch(self) -> str:
        """'tvq' (Transformer-VQ) or 'longvq' (LongVQ's language model), read from the model config's class."""
        return arch_of(self.model)

    def to_dict(self) -> dict:
        """The whole config as plain values, as the run's ``config.json`` holds it (``from_dict`` reads it back)."""
        return {"task": "lm", "arch": self.arch, "model": self.model.to_dict(), "train": self.train.to_dict()}

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON, keys sorted."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Rebuild from :meth:`to_dict` output (e.g. a checkpoint's config.json); without ``arch`` (a run saved
        before LongVQ existed) the model is Transformer-VQ's."""
        if not isinstance(values, dict):
            raise ConfigError(f"a run config is a mapping with 'model' and 'train', got {type(values).__name__}")
        unknown = sorted(set(values) - {"task", "arch", "model", "train"})
        if unknown:
            raise ConfigError(f"unknown top-level config key(s): {', '.join(unknown)}; expected 'task', 'arch', "
                              f"'model' and 'train'")
        if run_arch(values).task != "lm":
            raise ConfigError(f"this is the config of {run_arch(values).title}, not of a language model; read it "
                              f"with ClassifyConfig.from_dict")
        model_cls = find_arch("lm", values.get("arch", DEFAULT_ARCH)).config
        return cls(model=build(model_cls, values.get("model", {}), "model"),
                   train=build(TrainConfig, values.get("train", {}), "train"))


def check_compatible(model: TransformerVQConfig | LongVQConfig, train: TrainConfig) -> None:
    """The constraints that tie the training settings to the model: windows to its block length, and the options its
    architecture refuses (the registry's ``refused_options``: compilation of units a LongVQ model has none of)."""
    if train.update_len % model.block_len != 0:
        multiple = max(1, train.update_len // model.block_len) * model.block_len
        text = (f"must be a multiple of the model's block_len={model.block_len} (e.g. {multiple}, or change "
                f"block_len), got {train.update_len}")
        raise ConfigError(f"invalid RunConfig: update_len {text}", [("update_len", text)], TrainConfig)
    if train.pack and arch_of(model) == "tvq" and (not model.causal or train.context_parallel > 1):
        if not model.causal:  # the encoder itself takes position_ids; the masked objective does not pack rows
            text = ("packs documents for next-token training; tvq train's masked-token objective of an encoder "
                    "(causal=False) takes whole rows: leave --pack off, or train a causal model (an encoder "
                    "called directly accepts packed rows: model(ids, position_ids=...))")
        else:
            text = (f"does not combine with context_parallel={train.context_parallel} (a rank's chunk would need "
                    f"the document starts of the ranks before it): use one of them")
        raise ConfigError(f"invalid RunConfig: pack {text}", [("pack", text)], TrainConfig)
    for option, text in find_arch("lm", arch_of(model)).refused_options.items():
        if getattr(train, option) != TrainConfig.__dataclass_fields__[option].default:
            raise ConfigError(f"invalid RunConfig: {option} {text}", [(option, text)], TrainConfig)
    if train.context_parallel > 1:
        problem = model.context_parallel_problem() if isinstance(model, TransformerVQConfig) else None
        chunk = train.context_parallel * model.block_len
        if problem is not None:
            problem += "; leave context_parallel at 1 for this model"
        elif train.update_len % chunk != 0:
            problem = (f"splits each window of update_len={train.update_len} tokens into {train.context_parallel} "
                       f"chunks of whole blocks: make update_len a multiple of {chunk} "
                       f"(context_parallel x block_len)")
        if problem is not None:
            text = f"{train.context_parallel} {problem}"
            raise ConfigError(f"invalid RunConfig: context_parallel {text}", [("context_parallel", text)], TrainConfig)
