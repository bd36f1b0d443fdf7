"""VQ with a learned bias on the cache (``--cache-bias-init``) beside the preset's VQ, window-only and full cells.

    python benchmarks/cache_bias.py --baseline PRESET_RESULT.json --run INIT SEED RUN_DIR EVAL.json [--run ...] \
        --name NAME [--out benchmarks/results] [--note KEY=TEXT ...]

``--baseline`` is a results file of the preset's cells (``preset-codebook-size-*.json`` or ``preset-gcide-*.json``:
VQ and window-only at the preset's S, full attention's seeds), scored the same way; the operator at its default is
unchanged, so those cells stand. Each ``--run INIT SEED RUN_DIR EVAL`` is one trained run with the bias initialized
to ``INIT``: its ``tvq eval --json`` (bits per byte) and the learned bias of every unit at the end of training (read
from the run's last checkpoint). Writes ``NAME.json`` (every cell, the notes, the machine and its load average),
``NAME.md`` (mean and seeds per cell, the ratio to window-only and full, the learned biases) and ``NAME.png`` (bpb per
cell, the seeds as points). None of the figures is a timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from result_files import add_output_args, notes_of, publish, save_figure

from transformer_vq.bench.machine import machine_info
from transformer_vq.config.flags import not_empty
from transformer_vq.train.lm.build import model_from_checkpoint


def learned_bias(run_dir: str) -> tuple[int, list[float]]:
    """The run's S and the cache bias of every unit (one value per head, heads flattened) in its last checkpoint."""
    model, _, _ = model_from_checkpoint(run_dir, device="cpu")
    return model.cfg.n_code, [round(x, 4) for unit in model.units for x in unit.cache_bias.tolist()]


def collect(baseline_path: str, runs: list[list[str]], notes: dict) -> dict:
    """The result: the baseline's VQ and window-only seeds and full's, then each biased run."""
    baseline = json.loads(Path(baseline_path).read_text())
    biased = []
    for init, seed, run_dir, eval_path in runs:
        scored = json.loads(Path(eval_path).read_text())
        S, bias = learned_bias(run_dir)
        biased.append({"kind": f"vq, cache bias from {float(init):g}", "init": float(init), "seed": int(seed),
                       "bits_per_byte": scored["bits_per_byte"], "tokens": scored["tokens"],
                       "carry_tokens": scored["carry_tokens"], "learned_bias": bias, "run": Path(run_dir).name})
    cells = [{"kind": c["kind"].lower(), "seed": c["seed"], "bits_per_byte": c["bits_per_byte"],
              "tokens": c["tokens"], "source": Path(baseline_path).name}
             for c in baseline["cells"] if c["S"] == S]  # the cells at the biased runs' S
    cells += [{"kind": "full", "seed": seed, "bits_per_byte": bpb, "source": Path(baseline_path).name}
              for seed, bpb in enumerate(baseline["full"])]
    cells += biased
    return {"benchmark": "cache-bias", "S": S, "cells": cells, "notes": notes,
            "machine": machine_info(measure_peak=False)}


def groups(result: dict) -> dict[str, list[dict]]:
    found = {}
    for cell in sorted(result["cells"], key=lambda c: c["seed"]):
        found.setdefault(cell["kind"], []).append(cell)
    return found


def table(result: dict) -> str:
    by_kind = groups(result)
    mean = {kind: statistics.fmean(c["bits_per_byte"] for c in cells) for kind, cells in by_kind.items()}
    lines = ["| cell | seeds | mean bpb | vs window only | vs full | learned bias at step 600 (per unit) |",
             "|---|---|---:|---:|---:|---|"]
    for kind, cells in by_kind.items():
        seeds = " / ".join(f"{c['bits_per_byte']:.4f} (s{c['seed']})" for c in cells)
        biases = "; ".join(f"s{c['seed']}: " + ", ".join(f"{b:.2f}" for b in c["learned_bias"])
                           for c in cells if "learned_bias" in c) or "-"
        lines.append(f"| {kind} | {seeds} | **{mean[kind]:.4f}** | {mean[kind] / mean['window-only']:.4f} | "
                     f"{mean[kind] / mean['full']:.4f} | {biases} |")
    notes = [f"- {key}: {text}" for key, text in result["notes"].items()]
    machine = result["machine"]
    return "\n".join([f"# {result['name']} (S = {result['S']})", "", *lines, "", *notes, "",
                      f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']}, "
                      f"commit {machine['commit']}; load average when written {machine['load_average_start']}. "
                      "None of the figures here is a timing.", ""])


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_kind = groups(result)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for i, (kind, cells) in enumerate(by_kind.items()):
        values = [c["bits_per_byte"] for c in cells]
        ax.scatter([statistics.fmean(values)], [i], marker="|", s=400, color="black")
        ax.scatter(values, [i] * len(values), color="tab:blue")
    ax.set_yticks(range(len(by_kind)), list(by_kind))
    ax.set_xlabel("validation bits per byte (state reset every 2,048 tokens); bar: mean of seeds")
    ax.set_title(result["name"], fontsize=9)
    return save_figure(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=not_empty, required=True)
    parser.add_argument("--run", type=not_empty, nargs=4, action="append", required=True,
                        metavar=("INIT", "SEED", "RUN", "EVAL"))
    add_output_args(parser)
    args = parser.parse_args(argv)
    result = {"name": args.name, **collect(args.baseline, args.run, notes_of(args))}
    publish(result, table(result), args, plot)


if __name__ == "__main__":
    main()
