"""Where per-step metrics go: ``metrics.jsonl``, TensorBoard event files, and the console: stdout, where a run's
lines go (a tqdm progress bar when stdout is a terminal, plain lines every ``log_every`` steps otherwise)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.data.metrics import bpb_unit


class MetricsLogger:
    """Writes one JSON line and one set of TensorBoard scalars per step; only the main process
    should create one.

    Args:
        run_dir: the run directory (``metrics.jsonl`` and ``tb/`` go there).
        total_steps: for the progress bar.
        start_step: steps already done (when resuming).
        log_every: console line interval when stdout is not a terminal.
    """

    def __init__(self, run_dir: Path, *, total_steps: int, start_step: int, log_every: int):
        from torch.utils.tensorboard import SummaryWriter

        run_dir = Path(run_dir)
        drop_lines_after(run_dir / "metrics.jsonl", start_step)
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        # a killed run logged steps past its last checkpoint: the resumed run logs them again, in their place
        self.tensorboard = SummaryWriter(str(run_dir / "tb"), purge_step=start_step + 1)
        self.log_every = log_every
        self.total_steps = total_steps
        # step times vary with the machine's load: the console shows tokens/s over the steps since its
        # previous line; the totals give the run's average. Steps that compiled a graph (torch.compile) are timed
        # apart: a minute of compilation in a step of milliseconds made a short run's rate 6 tokens/s
        self._interval = [0, 0.0, 0]  # tokens, seconds, steps that compiled
        self.total_tokens, self.total_seconds = 0, 0.0
        self.compile_steps, self.compile_seconds = 0, 0.0
        self.bar = None
        if sys.stdout.isatty():
            from tqdm import tqdm

            # drawn where the check looked: on tqdm's default stderr, `tvq train 2> errors.log` on a terminal
            # showed no progress at all (the bar went to the file, the lines were off)
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", file=sys.stdout)

    def log_step(self, metrics: dict) -> None:
        """Record the metrics of one optimizer step (``metrics["step"]`` counts from 1)."""
        step = metrics["step"]
        self.jsonl.write(json.dumps(metrics) + "\n")
        self.jsonl.flush()
        for key, value in metrics.items():
            # None marks a non-finite value (JSON has no NaN): nothing to plot
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tensorboard.add_scalar(f"train/{key}", value, step)
        if metrics.get("compiled"):
            self._interval[2] += 1
            self.compile_steps += 1
            self.compile_seconds += metrics["seconds"]
        else:
            self._interval[0] += metrics["tokens"]
            self._interval[1] += metrics["seconds"]
            self.total_tokens += metrics["tokens"]
            self.total_seconds += metrics["seconds"]
        if self.bar is not None:
            self.bar.update(1)
            # a language model shows bits per byte, a classifier its training-batch accuracy
            shown = {"bpb": _fmt(metrics.get("bits_per_byte"), ".3f")} if "accuracy" not in metrics else \
                {"acc": _fmt(metrics["accuracy"], ".3f")}
            rate = self.tokens_per_s
            self.bar.set_postfix(loss=_fmt(metrics["loss"], ".4f"), **shown,
                                 tok_s="compiling" if rate is None else format(rate, ",.0f"))
        elif step % self.log_every == 0 or step == self.total_steps:
            tokens, seconds, compiled = self._interval
            self.print(format_step(metrics, self.total_steps, tokens / seconds if seconds else None, compiled))
            self._interval = [0, 0.0, 0]

    @property
    def tokens_per_s(self) -> float | None:
        """Training tokens per second over the steps logged so far (time in the steps themselves), leaving out the
        steps that compiled a graph; None before any other step."""
        return self.total_tokens / self.total_seconds if self.total_seconds else None

    def log_eval(self, step: int, split: str, result: dict) -> None:
        """Record an evaluation (its loss, bits per byte and, on PG-19, word-level perplexity; a classifier's loss
        and accuracy) at ``step``."""
        self.jsonl.write(json.dumps({"step": step, "eval": split, **result}) + "\n")
        self.jsonl.flush()
        if "accuracy" in result:
            for key in ("loss", "accuracy"):
                self.tensorboard.add_scalar(f"{split}/{key}", result[key], step)
            self.print(f"step {step}: {split} loss {result['loss']:.4f}, accuracy {result['accuracy']:.4f}")
            return
        keys = ("loss", "bits_per_byte") + (("word_perplexity",) if result.get("word_perplexity") is not None else ())
        for key in keys:
            self.tensorboard.add_scalar(f"{split}/{key}", result[key], step)
        words = (f", word-level perplexity {result['word_perplexity']:.2f}"
                 if result.get("word_perplexity") is not None else "")
        unit = bpb_unit(result.get("objective", "next-token"))
        self.print(f"step {step}: {split} loss {result['loss']:.4f}, {result['bits_per_byte']:.4f} {unit}{words}")

    def print(self, message: str) -> None:
        """Print without breaking the progress bar."""
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.tensorboard.close()
        self.jsonl.close()


def drop_lines_after(path: Path, step: int) -> None:
    """Keep in the metrics file ``path`` only the lines of steps up to ``step`` (the checkpoint a run resumes
    from): a run killed after its last checkpoint logged steps that the resumed run trains, and logs, again. A torn
    last line (killed mid-write) goes too. The file is replaced atomically, so a kill here loses nothing."""
    if not path.is_file():
        return
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    kept = [line for line in lines if _logged_by_step(line, step)]
    if len(kept) != len(lines):
        fileio.atomic_write_text(path, "".join(kept))


def _logged_by_step(line: str, step: int) -> bool:
    """Whether metrics line ``line`` is whole and belongs to a step up to ``step``."""
    try:
        return line.endswith("\n") and json.loads(line)["step"] <= step
    except (ValueError, KeyError, TypeError):
        return False


def format_step(metrics: dict, total_steps: int, tokens_per_s: float | None, compiled: int = 0) -> str:
    """One console line for a training step; ``tokens_per_s`` over the steps since the previous line but the
    ``compiled`` ones that compiled a graph (None: all of them did)."""
    shown = f"acc {_fmt(metrics['accuracy'], '.3f')}" if "accuracy" in metrics else \
        f"bpb {_fmt(metrics.get('bits_per_byte'), '.3f')}"  # a classifier's batch accuracy, a language model's bpb
    rate = "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"
    line = (f"step {metrics['step']}/{total_steps}  loss {_fmt(metrics['loss'], '.4f')}  {shown}  "
            f"lr {metrics['lr']:.2e}  tok/s {rate}")
    if compiled:
        line += f"  (compiled graphs: {compiled} step{'s' * (compiled > 1)} left out of tok/s)"
    if "codebook_perplexity" in metrics:
        line += f"  codebook ppl {_fmt(metrics['codebook_perplexity'], '.1f')}"
    if metrics.get("skipped"):
        line += "  (skipped: non-finite)"
    return line


def graphs_compiled() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (0 before it first ran): a step during which the
    count grows spent time compiling. Read from ``sys.modules``, as torch._dynamo is loaded only once it compiles."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: a non-finite number is logged as None."""
    return value if math.isfinite(value) else None


def _fmt(value, spec: str) -> str:
    """Format a number, or 'nan' for a missing (non-finite) one."""
    return "nan" if value is None else format(value, spec)
