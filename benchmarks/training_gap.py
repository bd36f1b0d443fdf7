"""How the gap between trained cells moves over training: the training bits per byte of each cell by step range and
its validation bits per byte at each evaluation, against a reference cell, from the runs' ``metrics.jsonl``.

    python benchmarks/training_gap.py --cell LABEL RUN_DIR [RUN_DIR ...] [--cell ...] --reference LABEL \
        --name NAME [--ranges 1-60,61-120,...] [--out benchmarks/results] [--note KEY=TEXT ...]

Each ``--cell`` names a cell and its runs (one per seed) trained on the same data in the same order (same seeds,
batch and sequence settings), so a step's training batch is the same bytes for every cell and the per-step ratio is
not noise from the data. Runs are paired by position: a cell of k runs is compared with the reference's first k, so
give every cell's runs in the same seed order. Step ranges default to doubling ones from 60 steps (1-60, 61-120,
121-240, ...). Writes
``NAME.json`` (per cell and seed: the training bpb per range and the validation curve), ``NAME.md`` (the tables: mean
over seeds, the ratio to the reference; the reference's own rows in bpb) and ``NAME.png`` (the ratio to the reference
over training: training bpb in 60-step means, validation points). None of the figures is a timing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from result_files import add_output_args, notes_of, publish, save_figure

from transformer_vq.ablate.cells import read_metrics
from transformer_vq.bench.machine import machine_info
from transformer_vq.config.flags import not_empty

SMOOTH = 60
"""Steps per point of the figure's training curve."""


def doubling_ranges(last_step: int, first: int = 60) -> list[tuple[int, int]]:
    """``(1, 60), (61, 120), (121, 240), ...`` up to ``last_step`` (the last range ends there)."""
    ranges, lo, hi = [], 1, first
    while lo <= last_step:
        ranges.append((lo, min(hi, last_step)))
        lo, hi = hi + 1, hi * 2
    return ranges


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``"1-60,61-120"`` -> ``[(1, 60), (61, 120)]``."""
    ranges = []
    for part in text.split(","):
        try:
            lo, hi = (int(x) for x in part.split("-"))
        except ValueError:
            lo = hi = 0
        if not 1 <= lo <= hi:
            raise argparse.ArgumentTypeError(f"{part!r} is not a step range lo-hi with 1 <= lo <= hi")
        ranges.append((lo, hi))
    return ranges


def read_run(run_dir: str) -> dict:
    """One run's training bpb per step and its validation rows; refuses a run with no training rows."""
    train, evals = read_metrics(Path(run_dir))
    if not train:
        raise SystemExit(f"{run_dir}: no training rows in metrics.jsonl (not a run directory, or not started)")
    return {"run": str(run_dir), "bpb": {row["step"]: row["bits_per_byte"] for row in train},
            "validation": [{"step": row["step"], "bits_per_byte": row["bits_per_byte"]} for row in evals]}


def range_mean(bpb: dict[int, float], lo: int, hi: int) -> float | None:
    steps = [s for s in range(lo, hi + 1) if s in bpb]
    return statistics.fmean(bpb[s] for s in steps) if steps else None


def collect(cells: list[list[str]], reference: str, ranges: list[tuple[int, int]] | None, notes: dict) -> dict:
    """Every cell's runs read and summarized by step range (``ranges`` None: doubling ones to the last step)."""
    runs = {cell[0]: [read_run(d) for d in cell[1:]] for cell in cells}
    if reference not in runs:
        raise SystemExit(f"--reference {reference!r} is not one of the cells: {', '.join(runs)}")
    last = max(max(r["bpb"]) for rs in runs.values() for r in rs)
    ranges = ranges or doubling_ranges(last)
    for rs in runs.values():
        for r in rs:
            r["ranges"] = [range_mean(r["bpb"], lo, hi) for lo, hi in ranges]
    return {"benchmark": "training-gap", "reference": reference, "ranges": ranges, "cells": runs, "notes": notes,
            "machine": machine_info(measure_peak=False)}


def seed_mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if len(present) == len(values) and present else None


def ratio_text(value: float | None, ref: float | None) -> str:
    return "-" if value is None or ref is None else f"{value / ref:.4f}"


def validation_steps(result: dict) -> list[int]:
    return sorted({v["step"] for rs in result["cells"].values() for r in rs for v in r["validation"]})


def validation_at(run: dict, step: int) -> float | None:
    return next((v["bits_per_byte"] for v in run["validation"] if v["step"] == step), None)


def validation_mean(runs: list[dict], step: int) -> float | None:
    return seed_mean([validation_at(r, step) for r in runs])


def paired_reference(cells: dict, ref: str, runs: list[dict]) -> list[dict]:
    """The reference's runs a cell's ``runs`` are compared with: the same seeds, paired by position."""
    return cells[ref][:len(runs)]


def table(result: dict) -> str:
    cells, ref = result["cells"], result["reference"]
    labels = [f"{lo}-{hi}" for lo, hi in result["ranges"]]
    mean = {c: [seed_mean([r["ranges"][i] for r in rs]) for i in range(len(labels))] for c, rs in cells.items()}
    paired = {c: [seed_mean([r["ranges"][i] for r in paired_reference(cells, ref, rs)]) for i in range(len(labels))]
              for c, rs in cells.items()}
    lines = [f"## Training bits per byte by step range (mean of seeds), as a ratio to `{ref}`'s same seeds", "",
             "| cell | seeds | " + " | ".join(labels) + " |", "|---|---:|" + "---:|" * len(labels)]
    for c, rs in cells.items():
        row = [f"{m:.4f}" if c == ref and m is not None else ratio_text(m, r) for m, r in zip(mean[c], paired[c])]
        lines.append(f"| {c}{' (bpb)' if c == ref else ''} | {len(rs)} | " + " | ".join(row) + " |")
    steps = validation_steps(result)
    lines += ["", "## Validation bits per byte at each evaluation (seeds; mean; ratio to the same seeds' mean of "
              f"`{ref}`)", "", "| cell | " + " | ".join(f"step {s}" for s in steps) + " |",
              "|---|" + "---|" * len(steps)]
    for c, rs in cells.items():
        row = []
        for s in steps:
            m, base = validation_mean(rs, s), validation_mean(paired_reference(cells, ref, rs), s)
            each = " / ".join("-" if v is None else f"{v:.4f}" for v in (validation_at(r, s) for r in rs))
            row.append(f"{each}; **{'-' if m is None else f'{m:.4f}'}** ({ratio_text(m, base)})")
        lines.append(f"| {c} | " + " | ".join(row) + " |")
    machine = result["machine"]
    notes = [f"- {key}: {text}" for key, text in result["notes"].items()]
    return "\n".join([f"# {result['name']}", "", *lines, "", "Runs: " + "; ".join(
        f"{c}: " + ", ".join(Path(r["run"]).name for r in rs) for c, rs in cells.items()), "", *notes, "",
        f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']}, commit "
        f"{machine['commit']}. None of the figures here is a timing.", ""])


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, ref = result["cells"], result["reference"]
    last = max(max(r["bpb"]) for rs in cells.values() for r in rs)
    starts = list(range(1, last + 1, SMOOTH))
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for i, (c, rs) in enumerate(cells.items()):
        if c == ref:
            continue
        color = f"C{i}"
        base = paired_reference(cells, ref, rs)
        mine = [seed_mean([range_mean(r["bpb"], s, s + SMOOTH - 1) for r in rs]) for s in starts]
        ref_train = [seed_mean([range_mean(r["bpb"], s, s + SMOOTH - 1) for r in base]) for s in starts]
        points = [(s + SMOOTH / 2, m / r) for s, m, r in zip(starts, mine, ref_train) if m is not None and r]
        ax.plot(*zip(*points), color=color, label=f"{c}: training bpb ({SMOOTH}-step means)")
        val = [(s, validation_mean(rs, s), validation_mean(base, s)) for s in validation_steps(result)]
        val = [(s, m / r) for s, m, r in val if m is not None and r is not None]
        if val:
            ax.plot(*zip(*val), "o", color=color, label=f"{c}: validation bpb")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"bits per byte / {ref}'s (mean of seeds)")
    ax.set_title(result["name"], fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", type=not_empty, nargs="+", action="append", required=True, metavar="LABEL_THEN_RUNS")
    parser.add_argument("--reference", type=not_empty, required=True)
    parser.add_argument("--ranges", type=parse_ranges, default=None)
    add_output_args(parser)
    args = parser.parse_args(argv)
    if any(len(cell) < 2 for cell in args.cell):
        parser.error("each --cell needs a label and at least one run directory")
    result = {"name": args.name, **collect(args.cell, args.reference, args.ranges, notes_of(args))}
    publish(result, table(result), args, plot)


if __name__ == "__main__":
    main()
