"""The experiment matrices of ``tvq ablate`` and the settings they share (torch-free, so ``tvq --help`` stays fast).

A matrix is a set of named cells, each a list of ``--set`` style overrides (``attn_type=full``) on one base model;
every cell is trained with the same data, steps, batch and seeds (docs/quality.md). The settings of one run of a
matrix are an :class:`AblateConfig`, whose fields are the ``tvq ablate`` flags; a matrix may replace their defaults
(the recall matrix trains on ``--data recall`` unless told otherwise) and may score every cell on a probe after its
training.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from transformer_vq.config.arch import DEFAULT_ARCH, LM_PRESETS
from transformer_vq.config.fields import ConfigError, check, fields_of, flag_of, option
from transformer_vq.config.jobs import eval_tokens_problem, threads_option
from transformer_vq.config.load import parse_override


@dataclass(frozen=True)
class Matrix:
    """A named set of cells: ``cells`` maps a cell name to its overrides, applied on top of ``base``."""

    name: str
    description: str
    cells: dict
    """cell name -> tuple of ``KEY=VALUE`` overrides (``--set`` syntax: a model or train field)."""
    reference: str
    """The cell every other cell's bpb is divided by in the table."""
    base: tuple = ()
    """Overrides shared by every cell (on top of the preset)."""
    defaults: tuple = ()
    """``(AblateConfig field, value)`` pairs replacing that field's default for this matrix (a value given still
    wins)."""
    probe: str | None = None
    """``"recall"``: after its training every cell is scored on the recall probe's test episodes (accuracy by
    distance); None: bpb only."""

    def __post_init__(self):
        if self.probe not in PROBES:
            raise ValueError(f"matrix {self.name!r}: probe must be one of {', '.join(map(str, PROBES))}, "
                             f"got {self.probe!r}")


def default_of(field: dataclasses.Field):
    """A dataclass field's default value (a fresh one for a field with a default factory)."""
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def flag_words(name: str, value) -> list[str]:
    """The ``tvq ablate`` flag words that set the field ``name`` to ``value``: ``["--steps", "300"]``,
    ``["--seeds", "0", "1"]``, one ``--data-option KEY=VALUE`` per item of a mapping."""
    flag = flag_of(fields_of(AblateConfig)[name])
    if isinstance(value, dict):  # written as parse_data_options reads them back (JSON scalars and lists are YAML)
        items = [f"{key}={v if isinstance(v, str) else json.dumps(v)}" for key, v in value.items()]
        return [word for item in items for word in (flag, item)]
    return [flag, *map(str, value)] if isinstance(value, tuple) else [flag, str(value)]


PROBES = (None, "recall")
"""What a cell can be scored on after its training, besides its validation bpb."""


# Every matrix trains the small preset with windows of 128 keys, so a 2,048-token sequence spans 16 blocks and most
# keys lie beyond the two-block window: the compressive cache has something to carry.
BASE = ("block_len=128", "flash_chunk_len=128")
MATRICES = {m.name: m for m in (
    Matrix("attention", "VQ (S = 512) vs the same GAU with unquantized keys, VQ without the compressive cache, "
                        "and FLASH (the paper's Table 2 direction)",
           {"vq": ("n_code=512",), "full": ("attn_type=full",),
            "vq-window-only": ("n_code=512", "compressive_cache=false"), "flash": ("attn_type=flash",)},
           reference="full", base=BASE),
    # The equal wall-clock view: at 8,192 tokens a step of unquantized keys attends to up to 8k keys per query, VQ's
    # to S + 2L; the steps are fewer and the batch smaller so that the two cells take minutes, not hours, per seed.
    Matrix("attention-long", "VQ (S = 512) vs unquantized keys at 8k tokens per sequence: validation bpb against "
                             "training seconds, where linear time matters",
           {"vq": ("n_code=512",), "full": ("attn_type=full",)}, reference="full", base=BASE,
           defaults=(("seq_len", 8192), ("update_len", 1024), ("batch_size", 2), ("steps", 300))),
    Matrix("codebook", "codebook size S from 32 to 512 (the paper's Table 1 direction: more codes, lower bpb)",
           {f"S{s}": (f"n_code={s}",) for s in (32, 64, 128, 256, 512)}, reference="S512", base=BASE),
    Matrix("bias-span", "the window position bias over the whole two-block window vs over one block (the "
                        "authors' span)",
           {"window": ("n_code=512", "bias_span=window"), "block": ("n_code=512", "bias_span=block")},
           reference="window", base=BASE),
    Matrix("codebook-care", "dead-code restart off vs on (codes unused for 50 updates re-seeded from recent keys); "
                            "codebook usage perplexity and unused codes over training",
           {"restart-off": ("n_code=512", "dead_code_restart=0"), "restart-on": ("n_code=512", "dead_code_restart=50")},
           reference="restart-off", base=BASE),
    # The preset as a user gets it (no override: the small preset's S and L, 256 and 64 since 2026-11-26), so that a
    # claim about "the shipped preset" is measured on it; the other matrices set S and raise L.
    Matrix("preset", "the preset as shipped: VQ vs VQ without the compressive cache vs unquantized keys",
           {"vq": (), "vq-window-only": ("compressive_cache=false",), "full": ("attn_type=full",)},
           reference="full"),
    # The model of the probe is sized for a 2-core CPU (docs/quality.md, "Memory probe"): 1,024-byte episodes are 32
    # blocks of 32, so pairs and queries lie up to 16-32 blocks apart, far beyond the two-block window.
    Matrix("recall", "long-range recall (--data recall): VQ vs VQ without the compressive cache vs unquantized keys, "
                     "scored by answer accuracy against distance",
           {"vq": (), "vq-window-only": ("compressive_cache=false",), "full": ("attn_type=full",)},
           reference="full", base=("d_model=128", "d_k=32", "d_v=256", "n_layers=2", "n_code=64", "block_len=32",
                                   "dropsin=0.0", "warmup_steps=50"),
           defaults=(("data", "recall"), ("seq_len", 1024), ("update_len", 128), ("batch_size", 8), ("steps", 3000),
                     ("data_options", {"n_pairs": 8, "train_episodes": 2048, "eval_episodes": 64})),
           probe="recall"),
)}
"""The matrices ``tvq ablate`` ships, by name."""


# The training fields every cell takes from tvq ablate itself (AblateConfig.cell_train, and two a cell never uses),
# each with what to do instead of --set: the flag that sets it, or why it is fixed
CELL_TRAIN_FIELDS = {
    "run_dir": "use --work-dir", "seed": "use --seeds", "data": "use --data", "data_path": "use --data-path",
    "data_options": "use --data-option", "steps": "use --steps", "seq_len": "use --seq-len",
    "update_len": "use --update-len", "batch_size": "use --batch-size", "eval_every": "use --eval-every",
    "eval_tokens": "use --eval-tokens", "ckpt_every": "use --ckpt-every", "threads": "use --threads",
    "device": "use --device", "keep_ckpts": "a cell keeps its newest checkpoint",
    "log_every": "a cell logs every twentieth of --steps", "sample_tokens": "cells sample nothing",
    "sample_prompt": "cells sample nothing", "name": "a cell's run directory is under --work-dir",
}


@dataclass(frozen=True, init=False)
class AblateConfig:
    """One run of an experiment matrix: which matrix, and the data, length, steps, batch and seeds of every cell.

    Fields are given by keyword; one not given takes the matrix's default (:attr:`Matrix.defaults`), else its own:
    ``AblateConfig(matrix="recall", steps=100)`` trains on the recall data, as ``tvq ablate --matrix recall`` does.
    """

    matrix: str = option("attention", "The matrix to run.", choices=tuple(MATRICES))
    seeds: tuple[int, ...] = option((0, 1), "Seeds; every cell is trained once per seed (the spread over seeds is "
                                            "reported).", min=0)
    cells: tuple[str, ...] = option((), "Cells to train and report, in this order (default: every cell of the "
                                        "matrix). The work directory is the matrix's either way: a later run "
                                        "with other cells, or none, continues it.", allow_empty=True)
    steps: int = option(600, "Optimizer steps per cell.", min=1)
    preset: str = option("small", "Model preset every cell starts from (before the matrix's overrides).",
                         choices=tuple(LM_PRESETS[DEFAULT_ARCH]))
    data: str = option("gcide", "Corpus (as tvq train --data).")
    data_path: str | None = option(None, "Local copy of the corpus (as tvq train --data-path).")
    data_options: dict = option(factory=dict, help="Keyword options of the corpus loader (as tvq train "
                                "--data-option; given, they replace the matrix's); repeatable KEY=VALUE.",
                                flag="data-option")
    seq_len: int = option(2048, "Tokens per sequence; the attention state is carried across its windows.", min=1,
                          k_suffix=True)
    update_len: int = option(256, "Backprop window (one optimizer step each).", min=1, k_suffix=True)
    batch_size: int = option(8, "Sequences per batch.", min=1)
    eval_every: int = option(0, "Validate every this many steps (0 = steps / 8).", min=0)
    eval_tokens: int = option(65536, "Validation tokens per evaluation (0 = the whole split).", min=0)
    ckpt_every: int = option(100, "Checkpoint every this many steps (a killed matrix resumes from there).", min=1)
    threads: int = threads_option("CPU threads per cell (0 = PyTorch's default).")
    jobs: int = option(1, "Trainings run at once, each in its own process (on a CPU give each --threads cores / "
                          "jobs); their records and the report are those of one at a time.", min=1)
    device: str = option("auto", "'auto', 'cpu' or 'cuda'.", choices=("auto", "cpu", "cuda"))
    overrides: tuple[str, ...] = option((), "Extra KEY=VALUE overrides applied to every cell (after the matrix's "
                                            "base; a field a cell sets itself is refused, as the cell's value would "
                                            "win).", flag="set", allow_empty=True)
    work_dir: str | None = option(None, "Where the cells' run directories and finished records go (default "
                                        "runs/ablate-<matrix>); rerunning with the same one resumes the matrix.")
    out: str = option("benchmarks/results", "Directory of the report: <name>.json, <name>.md and the PNG plots.")
    name: str | None = option(None, "File name stem of the report (default ablate-<matrix>).", file_stem=True)

    def __init__(self, **values):
        fields = fields_of(AblateConfig)
        matrix = MATRICES.get(values.get("matrix", fields["matrix"].default))
        # a copy of a mapping default: the config must not share (and let a caller change) the matrix's own
        defaults = {k: dict(v) if isinstance(v, dict) else v for k, v in (matrix.defaults if matrix else ())}
        values = {**defaults, **values}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise TypeError(f"AblateConfig got unknown field(s) {', '.join(unknown)}")
        for name, field in fields.items():
            object.__setattr__(self, name, values[name] if name in values else default_of(field))
        # --cells is checked against the matrix that runs (chosen): a caller may bring its own; --eval-tokens as tvq
        # train checks it, here rather than in each cell's training config, under that cell's name
        check(self, [eval_tokens_problem("eval_tokens", self.eval_tokens)])

    @property
    def resolved_eval_every(self) -> int:
        return self.eval_every or max(1, self.steps // 8)

    def resolved_work_dir(self) -> str:
        return self.work_dir or f"runs/ablate-{self.matrix}"

    def chosen(self, matrix: Matrix) -> Matrix:
        """``matrix`` with only the cells of ``--cells`` (all of them when none is named), in that order."""
        unknown = [c for c in self.cells if c not in matrix.cells]
        if unknown:  # named as its flag, --cells, on the command line
            text = f"{', '.join(map(repr, unknown))} are not in matrix {matrix.name!r} ({', '.join(matrix.cells)})"
            raise ConfigError(f"cells {text}", [("cells", text)], AblateConfig)
        chosen = dataclasses.replace(matrix, cells={c: matrix.cells[c] for c in self.cells or matrix.cells})
        self.refuse_overridden(chosen)
        return chosen

    def cell_train(self, seed: int, run_dir: str) -> dict:
        """The training fields every cell takes from this run (its flags), at ``seed``, in ``run_dir``."""
        return {
            "run_dir": run_dir, "seed": seed, "data": self.data, "data_path": self.data_path,
            "data_options": self.data_options, "steps": self.steps, "seq_len": self.seq_len,
            "update_len": self.update_len, "batch_size": self.batch_size, "eval_every": self.resolved_eval_every,
            "eval_tokens": self.eval_tokens, "ckpt_every": self.ckpt_every, "keep_ckpts": 1, "threads": self.threads,
            "device": self.device, "sample_tokens": 0, "log_every": max(1, self.steps // 20),
        }

    def refuse_overridden(self, matrix: Matrix) -> None:
        """Refuse (:class:`ConfigError`) an ``--set`` of a field that a cell of ``matrix`` sets itself, or that
        every cell takes from ``tvq ablate``'s own flags (:meth:`cell_train`): that value wins (it is applied after
        ``--set``), so the override would change nothing, silently (and the report would still name it)."""
        given = {parse_override(item)[:2]: item for item in self.overrides}
        for (section, key), item in given.items():
            if section == "train" and key in CELL_TRAIN_FIELDS:
                raise ConfigError(f"--set {item}: tvq ablate sets {key} itself for every cell; "
                                  f"{CELL_TRAIN_FIELDS[key]}")
        for cell, items in matrix.cells.items():
            for item in items:
                section, key, _ = parse_override(item)
                if (section, key) in given:
                    raise ConfigError(f"--set {given[section, key]}: cell {cell!r} of matrix {matrix.name!r} sets "
                                      f"{item} itself, and a cell's own value wins over --set; leave --set {key} out, "
                                      f"or leave out the cells that set it (--cells)")

    def resolved_name(self) -> str:
        return self.name or f"ablate-{self.matrix}"

    def to_dict(self) -> dict:
        """The fields as plain values (tuples stay tuples; JSON writes them as lists)."""
        return dataclasses.asdict(self)
