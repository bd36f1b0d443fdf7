"""A sweep of classifier settings on one dataset: the evidence a per-dataset recipe (transformer_vq.config.recipes)
is chosen by.

Each setting is a name and the ``tvq classify train`` flags that make it; every setting is trained once per seed with
the flags after ``--`` in common, each cell in its own process and run directory, and its best-validation checkpoint
evaluated on the test split (the cells of ``classify_compare.py``, resumable the same way). Writes a JSON record and
a markdown table: test accuracy per seed, mean, training time, others' load.

Example (the digits sweep of docs/longvq.md)::

    python benchmarks/classify_sweep.py --data digits --out benchmarks/results/classify-recipe-digits \\
        --setting "small preset=--preset small" --setting "recipe=" \\
        --setting "recipe, layer norm=--norm layer" -- --steps 1000
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from classify_compare import run_cell

from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty


def markdown(data: str, arch: str, rows: list[dict], common: list[str]) -> str:
    lines = [f"### {data}, {arch}: test accuracy per setting", "", f"Flags of every cell: `{' '.join(common)}`", "",
             "| setting | its flags | test accuracy per seed | mean | training time per seed | others' load per seed |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        accuracies = [c["test"]["accuracy"] for c in row["cells"]]
        seconds = ", ".join(f"{c['train_seconds']:.0f} s" for c in row["cells"])
        loads = ", ".join(f"{c['others_load']['others_runnable_mean']}" for c in row["cells"])
        lines.append(f"| {row['setting']} | `{' '.join(row['flags']) or '(none)'}` | "
                     f"{', '.join(f'{a:.2%}' for a in accuracies)} | **{statistics.fmean(accuracies):.2%}** | "
                     f"{seconds} | {loads} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=not_empty, required=True)
    parser.add_argument("--arch", type=not_empty, default="longvq")
    parser.add_argument("--out", type=not_empty, required=True, help="output path without extension (.json, .md)")
    parser.add_argument("--runs", type=not_empty, default="runs/sweep", help="where the cells' run directories go")
    parser.add_argument("--seeds", nargs="+", type=int_at_least(0), default=[0])
    parser.add_argument("--setting", type=not_empty, action="append", required=True, metavar="NAME=FLAGS",
                        help="a setting: its name, '=', and its flags (repeatable)")
    args = parser.parse_args(argv[:split])
    common = argv[split + 1:]
    rows = []
    for setting in args.setting:
        name, _, flags = setting.partition("=")
        flags = shlex.split(flags)
        cells = []
        for seed in args.seeds:
            slug = "".join(c if c.isalnum() else "-" for c in name)
            print(f"== {args.data}: {name}, seed {seed}", flush=True)
            cells.append(run_cell(args.data, args.arch, seed, Path(args.runs) / f"{args.data}-{slug}-s{seed}",
                                  [*flags, *common]))
        rows.append({"setting": name, "flags": flags, "cells": cells})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": command_line(), "machine": machine_info(measure_peak=False), "data": args.data,
              "arch": args.arch, "common_flags": common, "settings": rows}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    out.with_suffix(".md").write_text(markdown(args.data, args.arch, rows, common))
    print(markdown(args.data, args.arch, rows, common))
    return 0


if __name__ == "__main__":
    sys.exit(main())
