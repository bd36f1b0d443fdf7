"""LongVQ against its two baselines on one classification dataset, at the same training budget.

Trains ``tvq classify train --arch A --seed S`` for every architecture A (default: longvq,
transformer, tvq) and seed S, each in its own run directory and its own process, with identical
model fields, data, steps, batch and learning rate; then evaluates each run's best-validation
checkpoint on the test split. A finished cell (its test result saved) is skipped when the script is
run again, so a killed comparison continues where it stopped. Writes a JSON record, a markdown table
(test accuracy per architecture: each seed, mean and spread; then every cell's validation accuracy at each
evaluation with the training steps' seconds up to it) and a PNG of those learning curves against steps and seconds.

Example (the sequential Fashion-MNIST comparison of docs/longvq.md)::

    python benchmarks/classify_compare.py --data fashion-mnist --out benchmarks/results/compare-fmnist \\
        -- --preset small --steps 400 --batch-size 16 --lr 2e-3 --eval-every 200 \\
           --data-option validation_size=1000

Everything after ``--`` goes to every ``tvq classify train`` call unchanged.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty

ARCHS = ("longvq", "transformer", "tvq")


def run_cell(data: str, arch: str, seed: int, run_dir: Path, train_flags: list[str]) -> dict:
    """Train one (arch, seed) cell and evaluate its best checkpoint on the test split."""
    result_path = run_dir / "compare-result.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    tvq = [sys.executable, "-m", "transformer_vq"]
    train = [*tvq, "classify", "train", "--data", data, "--arch", arch, "--seed", str(seed),
             "--run-dir", str(run_dir), *train_flags]
    if (run_dir / "checkpoints").exists():
        train.append("--resume")
    with OthersLoad() as load:  # the training process is ours: only the other processes count
        started = time.perf_counter()
        trained = subprocess.run(train, check=True, stdout=subprocess.PIPE, text=True)
        train_seconds = time.perf_counter() - started
    print(trained.stdout, end="", flush=True)
    print(f"trained in {train_seconds:.1f} s; {load_text(load.summary())}", flush=True)
    millions = re.search(r"training a ([0-9.]+)M-parameter", trained.stdout)
    evaluated = subprocess.run([*tvq, "classify", "eval", "--ckpt", str(run_dir / "best"), "--split", "test",
                                "--json"], check=True, capture_output=True, text=True)
    test = json.loads(evaluated.stdout.strip().splitlines()[-1])
    config = json.loads((run_dir / "config.json").read_text())
    result = {"arch": arch, "seed": seed, "train_seconds": train_seconds, "others_load": load.summary(), "test": test,
              "parameters_millions": float(millions.group(1)) if millions else None,
              "validation": _validation_curve(run_dir / "metrics.jsonl"), "config": config}
    result_path.write_text(json.dumps(result, indent=1))
    return result


def _validation_curve(metrics: Path) -> list[dict]:
    """Validation accuracy at each evaluation, with the training steps' own seconds up to it (no evaluations, data or
    checkpoints: the wall-clock axis of a learning curve)."""
    curve, seconds = [], 0.0
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("eval") == "validation":
            curve.append({"step": row["step"], "accuracy": row["accuracy"], "train_seconds": round(seconds, 2)})
        elif "eval" not in row:
            seconds += row.get("seconds", 0.0)
    return curve


def summarize(results: list[dict]) -> dict[str, dict]:
    """Test accuracy per architecture: the seeds' values, their mean and their spread (max - min)."""
    table = {}
    for arch in dict.fromkeys(r["arch"] for r in results):
        accuracies = [r["test"]["accuracy"] for r in results if r["arch"] == arch]
        seconds = [r["train_seconds"] for r in results if r["arch"] == arch]
        loads = [r["others_load"]["others_runnable_mean"] for r in results if r["arch"] == arch
                 and r.get("others_load", {}).get("others_runnable_mean") is not None]
        table[arch] = {"parameters_millions": next(r["parameters_millions"] for r in results if r["arch"] == arch),
                       "accuracies": accuracies, "mean": statistics.fmean(accuracies),
                       "spread": max(accuracies) - min(accuracies), "train_seconds": statistics.median(seconds),
                       "seconds": seconds, "others_load": loads}
    return table


def markdown(data: str, table: dict[str, dict], train_flags: list[str]) -> str:
    """The comparison as a markdown table."""
    lines = [f"### {data}: test accuracy at the same training budget", "",
             f"Training flags (every cell): `{' '.join(train_flags)}`", "",
             "| architecture | parameters | test accuracy per seed | mean | spread | training time per seed | median "
             "| others' load per seed (runnable threads) |",
             "|---|---|---|---|---|---|---|---|"]
    for arch, row in table.items():
        seeds = ", ".join(f"{a:.2%}" for a in row["accuracies"])
        times = ", ".join(f"{s:.0f} s" for s in row.get("seconds", [row["train_seconds"]]))
        loads = ", ".join(f"{x:.2f}" for x in row.get("others_load", [])) or "-"
        lines.append(f"| {arch} | {row['parameters_millions']}M | {seeds} | **{row['mean']:.2%}** | "
                     f"{row['spread']:.2%} | {times} | {row['train_seconds']:.0f} s | {loads} |")
    return "\n".join(lines) + "\n"


def curve_markdown(results: list[dict]) -> str:
    """Validation accuracy at every evaluation of every cell, with its training seconds: the learning curves."""
    lines = ["| cell | " + " | ".join(f"step {c['step']}" for c in results[0]["validation"]) + " |",
             "|---|" + "---:|" * len(results[0]["validation"])]
    for r in results:
        cells = [f"{c['accuracy']:.1%}" + (f" ({c['train_seconds']:.0f} s)" if "train_seconds" in c else "")
                 for c in r["validation"]]
        lines.append(f"| {r['arch']}, seed {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(data: str, results: list[dict], path: Path) -> None:
    """Validation accuracy over steps, one line per cell, coloured by architecture."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = dict(zip(ARCHS, ("tab:blue", "tab:orange", "tab:green")))
    timed = all("train_seconds" in c for r in results for c in r["validation"])  # cells recorded before had no time
    fig, axes = plt.subplots(1, 1 + timed, figsize=(6 + 5 * timed, 4), squeeze=False)
    for ax, x, label in zip(axes[0], ("step", "train_seconds"), ("training step", "training seconds (steps only)")):
        for r in results:
            curve = r["validation"]
            ax.plot([c[x] for c in curve], [c["accuracy"] for c in curve], marker="o",
                    color=colours.get(r["arch"]), label=f"{r['arch']} (seed {r['seed']})")
        ax.set_xlabel(label)
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{data}: LongVQ vs baselines, same budget")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=not_empty, required=True)
    parser.add_argument("--out", type=not_empty, required=True, help="output path without extension (.json, .md, .png)")
    parser.add_argument("--runs", type=not_empty, default="runs/compare", help="where the cells' run directories go")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    parser.add_argument("--seeds", nargs="+", type=int_at_least(0), default=[0, 1])
    args = parser.parse_args(argv[:split])
    train_flags = argv[split + 1:]
    results = []
    for seed in args.seeds:  # seeds outermost: a partial comparison already has every architecture
        for arch in args.archs:
            print(f"== {args.data}: {arch}, seed {seed}", flush=True)
            results.append(run_cell(args.data, arch, seed, Path(args.runs) / f"{args.data}-{arch}-s{seed}",
                                    train_flags))
    table = summarize(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": command_line(), "machine": machine_info(measure_peak=False), "data": args.data,
              "train_flags": train_flags, "summary": table, "cells": results}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    out.with_suffix(".md").write_text(markdown(args.data, table, train_flags) + "\nValidation accuracy by step "
                                      "(training seconds, steps only):\n\n" + curve_markdown(results))
    plot(args.data, results, out.with_suffix(".png"))
    print(markdown(args.data, table, train_flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
