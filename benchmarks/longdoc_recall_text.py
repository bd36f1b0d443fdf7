"""The recall task mixed into real text: is window-only worse than VQ, and VQ close to full, in whole-split bpb?

    python benchmarks/longdoc_recall_text.py ABLATE.json --name NAME [--out DIR] [--others-load LOG.jsonl]
    python benchmarks/longdoc_recall_text.py --runs RUN [RUN ...] --trained-by TEXT --name NAME ...

Reads the report of a ``tvq ablate --matrix recall`` run on ``--data-option filler=text`` (cells ``vq``,
``vq-window-only`` and ``full``, each scored on the test episodes with bits per answer byte), or, with ``--runs``,
the run directories of such cells trained one by one (named ``CELL-seedN``, each with its ``recall.json``; a cell
missing is left blank; ``--trained-by`` says how they were trained), and writes ``NAME.json``,
``NAME.md`` and ``NAME.png``: the whole-split validation bpb of each cell (mean over seeds) and the two ratios the
issue asks for, then the curve: bits per answer byte by distance from pair to query (in blocks), per cell, and the
gaps window-only minus VQ and VQ minus full. ``--others-load``: a log of ``others_runnable`` samples taken while the
cells trained (one JSON object per line), summarized in the files. None of the figures is a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

from result_files import write_result

from transformer_vq.config.flags import file_stem, not_empty

CELLS = ("vq", "vq-window-only", "full")


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize(ablate: dict) -> dict:
    """Per cell: whole-split validation bpb per seed and mean; per distance bucket: bits per answer byte and accuracy
    (mean over seeds, and the seeds' values); the ratios and gaps."""
    options = ablate["settings"]["data_options"]
    seq_len, n_pairs = ablate["settings"]["seq_len"], options["n_pairs"]
    value_len = options.get("value_len", 1)
    answer_bytes = options.get("n_queries", n_pairs) * value_len
    cells = {}
    for cell in CELLS:
        records = [r for r in ablate["cells"] if r["cell"] == cell and r["status"] == "done"]
        recalls = [r["recall"] for r in records if "recall" in r]
        buckets = []
        for index, row in enumerate(recalls[0]["buckets"] if recalls else []):
            per_seed = [rec["buckets"][index] for rec in recalls if len(rec["buckets"]) > index]
            buckets.append({"bucket": row["bucket"], "queries_per_seed": row["queries"],
                            "answer_bpb": _mean([b.get("answer_bpb") for b in per_seed]),
                            "answer_bpb_seeds": [b.get("answer_bpb") for b in per_seed],
                            "accuracy": _mean([b["accuracy"] for b in per_seed]),
                            "accuracy_seeds": [b["accuracy"] for b in per_seed]})
        cells[cell] = {"seeds": [r["seed"] for r in records], "val_bpb_seeds": [r["final_bpb"] for r in records],
                       "val_bpb": _mean([r["final_bpb"] for r in records]),
                       "answer_bpb": _mean([rec.get("answer_bpb") for rec in recalls]),
                       "accuracy": _mean([rec["accuracy"] for rec in recalls]), "buckets": buckets,
                       "test_bpb": _mean([rec.get("bpb") for rec in recalls]), "parts": _parts(recalls)}
    vq, window, full = (cells[c]["val_bpb"] for c in CELLS)
    ratios = {}
    if None not in (vq, window, full):
        ratios = {"window_only_vs_vq": window / vq - 1, "vq_vs_full": vq / full - 1,
                  "per_seed_window_only_vs_vq": [w / v - 1 for w, v in zip(cells["vq-window-only"]["val_bpb_seeds"],
                                                                            cells["vq"]["val_bpb_seeds"])],
                  "per_seed_vq_vs_full": [v / f - 1 for v, f in zip(cells["vq"]["val_bpb_seeds"],
                                                                  cells["full"]["val_bpb_seeds"])]}
    gaps = []
    for index, row in enumerate(cells["vq"]["buckets"]):
        def bits(cell):
            rows = cells[cell]["buckets"]
            return rows[index]["answer_bpb"] if index < len(rows) else None
        v, w, f = bits("vq"), bits("vq-window-only"), bits("full")
        gaps.append({"bucket": row["bucket"], "window_only_minus_vq": None if None in (v, w) else w - v,
                     "vq_minus_full": None if None in (v, f) else v - f})
    part_gaps = {name: {"window_only_minus_vq": _difference(cells, "vq-window-only", "vq", name),
                        "vq_minus_full": _difference(cells, "vq", "full", name)} for name in cells["vq"]["parts"]}
    return {"answer_bytes_per_episode": answer_bytes, "seq_len": seq_len, "part_gaps": part_gaps,
            "answer_share": answer_bytes / seq_len,
            # a model that recalls every answer against one that guesses among the ten digits, all else equal
            "guess_minus_perfect_bpb": answer_bytes * math.log2(10) / seq_len,
            "cells": cells, "ratios": ratios, "gaps": gaps}


def _parts(recalls: list[dict]) -> dict:
    """Per kind of byte: its share of the test episodes' bits per byte, mean over seeds (empty when not measured)."""
    if not recalls or not all(rec.get("parts") for rec in recalls):
        return {}
    return {name: _mean([rec["parts"][name]["bpb_share"] for rec in recalls]) for name in recalls[0]["parts"]}


def _difference(cells: dict, a: str, b: str, part: str):
    x, y = cells[a]["parts"].get(part), cells[b]["parts"].get(part)
    return None if None in (x, y) else x - y


def from_runs(run_dirs: list[str], trained_by: str) -> dict:
    """An ablate report's fields (as :func:`summarize` and :func:`markdown` read them) from cells' run directories;
    the machine is described now, when the report is made."""
    from transformer_vq.ablate.cells import cell_record
    from transformer_vq.bench.machine import load_average, machine_info

    cells = []
    for run_dir in map(Path, run_dirs):
        cell, _, seed = run_dir.name.rpartition("-seed")
        cells.append(cell_record(cell, int(seed), run_dir, wall_s=0.0))
    train = json.loads((Path(run_dirs[0]) / "config.json").read_text())["train"]
    return {"command": trained_by, "summary": [], "load_average_end": load_average(),
            "settings": {"seq_len": train["seq_len"], "steps": train["steps"], "data_options": train["data_options"]},
            "machine": machine_info(measure_peak=False), "cells": cells}


def load_summary(path: str | None) -> dict | None:
    """Mean and maximum of the ``others_runnable`` samples of a log, and how many there were."""
    if not path:
        return None
    samples = [json.loads(line)["others_runnable"] for line in Path(path).read_text().splitlines() if line.strip()]
    samples = [s for s in samples if s is not None]
    return {"samples": len(samples), "mean": _mean(samples), "max": max(samples) if samples else None,
            "note": "runnable threads of every process but the logger, sampled once a minute while the cells "
                    "trained; the training itself is one of them"}


def _fmt(value, spec=".4f"):
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> list[str]:
    s, ablate = result["summary"], result["ablate"]
    filler = ablate["settings"]["data_options"].get("filler", "pattern")
    what = "mixed into Shakespeare" if filler == "text" else f"with the {filler} filler"
    lines = [f"# {result['name']}: the recall task {what}", "",
             f"Command: `{ablate['command']}`, then `{result['command']}`.", "",
             f"Machine: {ablate['machine']['cpu']}, {ablate['machine']['logical_cpus']} logical CPUs, torch "
             f"{ablate['machine']['torch']}, numpy {ablate['machine']['numpy']}, Python {ablate['machine']['python']}; "
             f"commit {ablate['machine']['commit'][:7]}{' (dirty)' if ablate['machine'].get('dirty') else ''}; "
             f"load average at the start {ablate['machine'].get('load_average_start')}, at the end "
             f"{ablate.get('load_average_end')}.", ""]
    if result.get("others_load"):
        o = result["others_load"]
        lines += [f"Others' load: {_fmt(o['mean'], '.2f')} runnable threads on average (max {o['max']}, "
                  f"{o['samples']} samples; {o['note']}).", ""]
    lines += ["None of the figures here is a timing.", "",
              f"Answers are {s['answer_bytes_per_episode']} of {s['seq_len']} bytes per episode "
              f"({s['answer_share']:.1%}); a model that recalled every answer would be "
              f"{s['guess_minus_perfect_bpb']:.3f} bpb better than one that guessed among the ten digits.", "",
              "| cell | whole-split validation bpb (mean) | seeds | test bits per answer byte | test answer accuracy |",
              "|---|---:|---|---:|---:|"]
    for cell in CELLS:
        c = s["cells"][cell]
        seeds = ", ".join(f"{v:.4f}" for v in c["val_bpb_seeds"])
        lines.append(f"| `{cell}` | {_fmt(c['val_bpb'])} | {seeds} | {_fmt(c['answer_bpb'], '.3f')} | "
                     f"{_fmt(c['accuracy'], '.1%')} |")
    if s["ratios"]:
        r = s["ratios"]
        lines += ["", f"Window-only vs VQ: {r['window_only_vs_vq']:+.2%} (per seed "
                      f"{', '.join(f'{x:+.2%}' for x in r['per_seed_window_only_vs_vq'])}); VQ vs full: "
                      f"{r['vq_vs_full']:+.2%} (per seed {', '.join(f'{x:+.2%}' for x in r['per_seed_vq_vs_full'])})."]
    lines += _parts_lines(s)
    lines += ["", "Bits per answer byte by distance from pair to query (test episodes, mean over seeds; accuracy in "
                  "brackets), and the gaps:", "",
              "| distance (blocks) | queries per seed | `vq` | `vq-window-only` | `full` "
              "| window-only − VQ | VQ − full |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for index, gap in enumerate(s["gaps"]):
        cols = []
        for cell in CELLS:
            rows = s["cells"][cell]["buckets"]
            row = rows[index] if index < len(rows) else None
            cols.append("-" if row is None else f"{_fmt(row['answer_bpb'], '.3f')} [{_fmt(row['accuracy'], '.0%')}]")
        queries = s["cells"]["vq"]["buckets"][index]["queries_per_seed"]
        lines.append(f"| {gap['bucket']} | {queries} | {' | '.join(cols)} "
                     f"| {_fmt(gap['window_only_minus_vq'], '+.3f')} | {_fmt(gap['vq_minus_full'], '+.3f')} |")
    return lines


def _parts_lines(s: dict) -> list[str]:
    """Where the whole-episode gap comes from: each kind of byte's share of the test episodes' bits per byte."""
    if not s.get("part_gaps"):
        return []
    lines = ["", "Where the bits go: each kind of byte's share of the test episodes' bits per byte (mean over seeds; "
                 "the shares add up to the test bpb in the last row), and the gaps:", "",
             "| kind of byte | `vq` | `vq-window-only` | `full` | window-only − VQ | VQ − full |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, gap in s["part_gaps"].items():
        shares = [_fmt(s["cells"][cell]["parts"].get(name)) for cell in CELLS]
        lines.append(f"| {name} | {' | '.join(shares)} | {_fmt(gap['window_only_minus_vq'], '+.4f')} | "
                     f"{_fmt(gap['vq_minus_full'], '+.4f')} |")
    totals = [s["cells"][cell]["test_bpb"] for cell in CELLS]
    gaps = [None if None in (a, b) else a - b for a, b in ((totals[1], totals[0]), (totals[0], totals[2]))]
    lines.append(f"| all (test bpb) | {' | '.join(_fmt(t) for t in totals)} | {_fmt(gaps[0], '+.4f')} | "
                 f"{_fmt(gaps[1], '+.4f')} |")
    return lines


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    labels = [g["bucket"] for g in s["gaps"]]
    x = list(range(len(labels)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for cell in CELLS:
        rows = s["cells"][cell]["buckets"][:len(x)]
        means = [r["answer_bpb"] for r in rows]
        lo = [min(r["answer_bpb_seeds"]) for r in rows]
        hi = [max(r["answer_bpb_seeds"]) for r in rows]
        left.plot(x[:len(means)], means, marker="o", label=cell)
        left.fill_between(x[:len(means)], lo, hi, alpha=0.2)
    left.axhline(math.log2(10), color="grey", linestyle="--", label="guessing a digit (3.32)")
    left.set(xticks=x, xticklabels=labels, xlabel="distance from pair to query (blocks)",
             ylabel="bits per answer byte (test)", title="Answer bits by distance")
    left.legend()
    for key, label in (("window_only_minus_vq", "window-only − VQ"), ("vq_minus_full", "VQ − full")):
        right.plot(x, [g[key] for g in s["gaps"]], marker="o", label=label)
    right.axhline(0, color="grey", linewidth=0.8)
    right.set(xticks=x, xticklabels=labels, xlabel="distance from pair to query (blocks)",
              ylabel="gap in bits per answer byte", title="The gap against the distance the data needs")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ablate", type=not_empty, nargs="?")
    parser.add_argument("--runs", type=not_empty, nargs="+", default=None)
    parser.add_argument("--trained-by", type=not_empty, default=None)
    parser.add_argument("--name", type=file_stem, required=True)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--others-load", type=not_empty, default=None)
    args = parser.parse_args(argv)
    if (args.ablate is None) == (args.runs is None) or (args.runs is not None) != (args.trained_by is not None):
        parser.error("give an ablate report, or --runs with --trained-by")
    ablate = from_runs(args.runs, args.trained_by) if args.runs else json.loads(Path(args.ablate).read_text())
    result = {"benchmark": "longdoc-recall-text", "name": args.name,
              "command": "python " + shlex.join(["benchmarks/longdoc_recall_text.py",
                                                 *(sys.argv[1:] if argv is None else argv)]),
              "ablate": {k: ablate[k] for k in ("command", "settings", "machine", "load_average_end", "summary")},
              "others_load": load_summary(args.others_load), "summary": summarize(ablate)}
    out = write_result(result, "\n".join(markdown(result)) + "\n", args.out, args.name)
    plot(result, out / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
