"""Validation bpb against the codebook size S of a preset: VQ and window-only cells beside full attention's line.

    python benchmarks/preset_codebook_size.py --cell vq 256 0 EVAL.json CODEBOOK.json [--cell ...] \
        --full 2.4641 2.4709 --name NAME [--out benchmarks/results] [--note KEY=TEXT ...]

Each ``--cell KIND S SEED EVAL CODEBOOK`` names one trained run by the files its scoring wrote: ``tvq eval --json``
(its ``bits_per_byte``) and ``tvq codebook --json`` (usage perplexity, unused and dead codes per unit). Full
attention does not depend on S, so it enters as its seeds' bpb (``--full``), a horizontal line. Writes ``NAME.json``
(every cell, the notes, the machine), ``NAME.md`` (mean and spread over seeds per kind and S, the ratio to full, the
codebook health) and ``NAME.png`` (bpb against S, log axis). The training and scoring commands go in ``--note``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import textwrap
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import float_in, not_empty
from result_files import add_output_args, notes_of


def _codebook_health(report: dict) -> dict:
    """Usage perplexity, unused and dead codes of every unit of a ``tvq codebook --json`` report, as ranges."""
    units = report["units"]
    return {key: [min(u[key] for u in units), max(u[key] for u in units)]
            for key in ("perplexity", "unused", "dead")} | {"codes": units[0]["codes"]}


def collect(cells: list[list[str]], full: list[float], notes: dict) -> dict:
    """The result dict: one row per cell (kind, S, seed, bpb, codebook health), full's seeds, notes, machine."""
    rows = []
    for kind, n_code, seed, eval_path, codebook_path in cells:
        scored = json.loads(Path(eval_path).read_text())
        rows.append({"kind": kind, "S": int(n_code), "seed": int(seed), "bits_per_byte": scored["bits_per_byte"],
                     "carry_tokens": scored.get("carry_tokens"), "tokens": scored["tokens"],
                     "codebook": _codebook_health(json.loads(Path(codebook_path).read_text()))})
    return {"benchmark": "preset-codebook-size", "command": command_line(), "cells": rows, "full": full,
            "notes": notes, "machine": machine_info(measure_peak=False)}


def _groups(result: dict) -> dict[tuple[str, int], list[dict]]:
    groups = {}
    for row in sorted(result["cells"], key=lambda r: (r["kind"], r["S"], r["seed"])):
        groups.setdefault((row["kind"], row["S"]), []).append(row)
    return groups


def table(result: dict) -> str:
    """Markdown: per kind and S, the seeds' bpb, their mean, the ratio to full's mean and the codebook health."""
    full = statistics.fmean(result["full"])
    lines = ["| cell | S | bpb per seed | mean | vs full | usage perplexity per unit | unused codes | dead codes |",
             "|---|---:|---|---:|---:|---|---|---|"]
    for (kind, n_code), rows in _groups(result).items():
        mean = statistics.fmean(r["bits_per_byte"] for r in rows)
        health = [" / ".join(f"{lo:.0f}-{hi:.0f}" if isinstance(lo, float) else f"{lo}-{hi}"
                             for lo, hi in (r["codebook"][key] for r in rows))
                  for key in ("perplexity", "unused", "dead")]
        seeds = " / ".join(f"{r['bits_per_byte']:.4f}" for r in rows)
        lines.append(f"| {kind} | {n_code} | {seeds} | "
                     f"**{mean:.4f}** | {mean / full:.4f} | {' | '.join(health)} |")
    lines.append(f"| full (any S) | - | {' / '.join(f'{b:.4f}' for b in result['full'])} | **{full:.4f}** | 1.0000 "
                 "| - | - | - |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Mean bpb against S per kind (each seed a dot), full attention's mean as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    kinds = {}
    for (kind, n_code), rows in _groups(result).items():
        kinds.setdefault(kind, []).append((n_code, [r["bits_per_byte"] for r in rows]))
    for kind, points in kinds.items():
        line, = ax.plot([s for s, _ in points], [statistics.fmean(b) for _, b in points], marker="o", label=kind)
        for n_code, seeds in points:
            ax.scatter([n_code] * len(seeds), seeds, s=10, color=line.get_color(), alpha=0.5)
    ax.axhline(statistics.fmean(result["full"]), color="black", linestyle="--", label="full (unquantized keys)")
    ax.set_xscale("log", base=2)
    sizes = sorted({n_code for points in kinds.values() for n_code, _ in points})
    ax.set_xticks(sizes, [str(n_code) for n_code in sizes])
    ax.set_xlabel("codebook size S")
    ax.set_ylabel("validation bpb (line: mean; dots: seeds)")
    ax.set_title(textwrap.fill(result["notes"].get("title", "bpb against codebook size"), 80), fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written = fileio.save_png(fig, path, dpi=120)
    plt.close(fig)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", type=not_empty, nargs=5, action="append", required=True,
                        metavar=("KIND", "S", "SEED", "EVAL_JSON", "CODEBOOK_JSON"))
    parser.add_argument("--full", nargs="+", type=float_in(0, low_open=True), required=True,
                        help="full attention's bpb, one per seed")
    add_output_args(parser)
    args = parser.parse_args(argv)
    result = collect(args.cell, args.full, notes_of(args))
    out = Path(args.out)
    fileio.atomic_write_text(out / f"{args.name}.json", json.dumps(result, indent=1) + "\n")
    notes = [f"- {key}: {text}" for key, text in result["notes"].items() if key != "title"]
    m = result["machine"]
    machine = (f"- machine (at writing): {m['cpu']}, {m['logical_cpus']} logical CPUs; torch {m['torch']}; "
               f"commit {m['commit']}")
    fileio.atomic_write_text(out / f"{args.name}.md", "\n".join(
        [f"# {result['notes'].get('title', args.name)}", "", *notes, machine, "", table(result), ""]))
    print(table(result))
    print(f"wrote {out / args.name}.json, .md, {plot(result, out / f'{args.name}.png')}")


if __name__ == "__main__":
    main()
