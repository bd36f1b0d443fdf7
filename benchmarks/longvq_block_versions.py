"""One block as built by several commits, side by side: LongVQ before and after a change, and the full-attention block,
time and peak memory, interleaved round by round (issue 22, item 3: the paper's speed shape at 4k, 8k, 16k).

    python benchmarks/longvq_block_versions.py --variant before=REV:longvq after=WORKTREE:longvq \
        sdpa=WORKTREE:transformer [--lengths 4k 8k 16k] [--rounds 3] --out benchmarks/results/NAME

A variant is ``LABEL=REV:KIND``: the package ``transformer_vq/`` of git revision ``REV`` (``git archive``;
``WORKTREE`` for this checkout as it is) timing the block ``KIND`` (``longvq``, ``longvq-relu2``, ``transformer``,
``transformer-dense``) with that revision's ``tvq bench longvq`` cell (``transformer_vq.bench.longvq:longvq_cell``) at
the widths of this checkout's ``--preset`` (default ``lra-text``), fp32, batch 1. Each round runs, for every variant
in an order rotating from round to round, two cells, each in a fresh process: the forward pass alone (eval, no
gradients) and forward + backward (train; gradients of the weights and the input): one warm-up call, one timed call,
and the cell's peak RSS rise over the RSS after its imports (so a forward's peak is the forward's own). The table
gives per length the median seconds over rounds, the median of the per-round ratios to each ``--baseline`` variant
(same round, same load; e.g. the fused ``transformer`` and the materialized ``transformer-dense``) and the highest
peak rise; with the others' load meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

from transformer_vq.bench.config import LONGVQ_BENCH_PRESETS, LongVQBenchConfig
from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty

ROOT = Path(__file__).resolve().parent.parent
CELL = """
import json, sys
from transformer_vq.bench.isolate import run_cell
print(json.dumps(run_cell("transformer_vq.bench.longvq:longvq_cell", json.loads(sys.argv[1]), isolate=True)))
"""


def source(rev: str, scratch: Path) -> Path:
    """A directory holding ``transformer_vq/`` of ``rev`` (this checkout for ``WORKTREE``)."""
    if rev == "WORKTREE":
        return ROOT
    where = scratch / rev
    if not where.exists():
        where.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev, "transformer_vq"], cwd=ROOT, capture_output=True, check=True)
        archive_path = where / "src.tar"
        archive_path.write_bytes(archive.stdout)
        with tarfile.open(archive_path) as tar:
            tar.extractall(where, filter="data")
    return where


def run(src: Path, kind: str, length: int, config: dict, backward: bool) -> dict:
    """One cell in a fresh process importing ``transformer_vq`` from ``src``."""
    kwargs = {"kind": kind, "length": length, "config": config, "repeats": 1, "warmup": 1, "backward": backward}
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", CELL, json.dumps(kwargs)], cwd=src, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    if row.get("status") != "ok":
        raise RuntimeError(f"{kind} T={length}: {row}")
    return row


def ratio_rows(samples: dict, variants: dict, baselines: list[str]) -> list[dict]:
    """One row per (variant, T, mode): its seconds, median, highest peak rise, and against each baseline the median of
    the per-round time ratios (``speedup_vs[b]``) and the ratio of the highest peak rises (``memory_vs[b]``)."""
    rows = []
    for (label, length, mode), got in samples.items():
        peak = max(p for _, p in got)
        row = {"variant": label, **{k: variants[label][k] for k in ("rev", "kind", "commit")}, "T": length,
               "mode": mode, "seconds": [s for s, _ in got], "median_s": statistics.median(s for s, _ in got),
               "peak_rise_bytes": peak, "speedup_vs": {}, "memory_vs": {}}
        for baseline in baselines:
            base = samples[baseline, length, mode]
            row["speedup_vs"][baseline] = statistics.median(b / s for (s, _), (b, _) in zip(got, base))
            row["memory_vs"][baseline] = peak / max(p for _, p in base)
        rows.append(row)
    return rows


def table_lines(rows: list[dict], labels: list[str], baselines: list[str]) -> list[str]:
    """The markdown table: per length and mode, every variant's median, speed and memory against each baseline."""
    speed = "".join(f" speed vs {b} |" for b in baselines)
    memory = "".join(f" memory vs {b} |" for b in baselines)
    lines = [f"| T | mode | variant (rev, block) | median s |{speed} peak rise MiB |{memory}",
             "|---:|---|---|---:|" + "---:|" * (2 * len(baselines) + 1)]
    for row in sorted(rows, key=lambda r: (r["T"], r["mode"], labels.index(r["variant"]))):
        speeds = " | ".join(f"{row['speedup_vs'][b]:.2f}x" for b in baselines)
        memories = " | ".join(f"{row['memory_vs'][b]:.2f}x" for b in baselines)
        lines.append(f"| {row['T']} | {row['mode']} | {row['variant']} ({row['commit'][:7]}, {row['kind']}) | "
                     f"{row['median_s']:.3f} | {speeds} | {row['peak_rise_bytes'] / 2**20:.0f} | {memories} |")
    return lines


def plot(record: dict, path: Path) -> None:
    """Per baseline, one panel: every other variant's speed ratio against T (forward solid, forward + backward dashed)
    and its memory ratio (dotted), with 1x marked: where a curve is above the line the variant is faster or, for
    memory, larger."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baselines = record["baselines"]
    fig, axes = plt.subplots(1, len(baselines), figsize=(5.5 * len(baselines), 4.2), squeeze=False)
    for ax, baseline in zip(axes[0], baselines):
        for label in dict.fromkeys(r["variant"] for r in record["rows"] if r["variant"] != baseline):
            for mode, key, style in (("fwd", "speedup_vs", "-"), ("fwd+bwd", "speedup_vs", "--"),
                                     ("fwd+bwd", "memory_vs", ":")):
                rows = sorted((r for r in record["rows"] if r["variant"] == label and r["mode"] == mode),
                              key=lambda r: r["T"])
                name = f"{label}: {'memory' if key == 'memory_vs' else 'speed'} ({mode})"
                ax.plot([r["T"] for r in rows], [r[key][baseline] for r in rows], style, marker="o", label=name)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(f"ratio against {baseline}")
        ax.set_title(f"against {baseline}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", type=not_empty, nargs="+", required=True, help="LABEL=REV:KIND")
    parser.add_argument("--baseline", type=not_empty, nargs="+",
                        help="the labels the ratios are taken against, a column group each (default: the last variant)")
    parser.add_argument("--lengths", type=int_at_least(1), nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--rounds", type=int_at_least(1), default=3)
    parser.add_argument("--preset", default="lra-text", choices=sorted(LONGVQ_BENCH_PRESETS))
    parser.add_argument("--out", type=not_empty, required=True, help="output path without extension")
    args = parser.parse_args(argv)
    variants = {}
    for text in args.variant:
        label, _, rest = text.partition("=")
        rev, _, kind = rest.rpartition(":")
        variants[label] = {"rev": rev, "kind": kind}
    baselines = args.baseline or [list(variants)[-1]]
    if not set(baselines) <= set(variants):
        parser.error(f"--baseline: {sorted(set(baselines) - set(variants))} not among the variants' labels")
    cfg = LongVQBenchConfig(model=LONGVQ_BENCH_PRESETS[args.preset])
    config = asdict(cfg)
    samples = {}  # (label, T, mode) -> list of (seconds, peak rise bytes)
    with tempfile.TemporaryDirectory() as scratch, OthersLoad() as load:
        for v in variants.values():
            v["commit"] = subprocess.run(["git", "rev-parse", "HEAD" if v["rev"] == "WORKTREE" else v["rev"]],
                                         cwd=ROOT, capture_output=True, text=True).stdout.strip()
            v["src"] = source(v["rev"], Path(scratch))
        labels = list(variants)
        for length in args.lengths:
            for r in range(args.rounds):
                for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                    v = variants[label]
                    fwd = run(v["src"], v["kind"], length, config, backward=False)
                    both = run(v["src"], v["kind"], length, config, backward=True)
                    for mode, row, key in (("fwd", fwd, "forward_s"), ("fwd+bwd", both, "fwd_bwd_s")):
                        samples.setdefault((label, length, mode), []).append((row[key], row["peak_rss_rise_bytes"]))
                    print(f"T={length} round {r} {label}: fwd {fwd['forward_s']:.3f} s "
                          f"({fwd['peak_rss_rise_bytes'] / 2**20:.0f} MiB), fwd+bwd {both['fwd_bwd_s']:.3f} s "
                          f"({both['peak_rss_rise_bytes'] / 2**20:.0f} MiB)", flush=True)
    rows = ratio_rows(samples, variants, baselines)
    summary = load.summary()
    record = {"machine": machine_info(measure_peak=False), "model": asdict(cfg.model), "batch_size": cfg.batch_size,
              "baselines": baselines, "rounds": args.rounds, "others_load": summary, "rows": rows,
              "command": command_line()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str))
    plot(record, out.with_suffix(".png"))
    lines = table_lines(rows, labels, baselines)
    m = record["machine"]
    text = (f"# One block, several versions, interleaved\n\n`{record['command']}`\n\nMachine: {m['cpu']}, "
            f"{m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads, torch {m['torch']}, python "
            f"{m['python']}; this checkout at {m.get('commit')} (dirty: {m.get('dirty')}). Widths {args.preset}: "
            f"{cfg.model}; B = {cfg.batch_size}, fp32. {args.rounds} rounds, each cell a fresh process (one warm-up "
            f"call, one timed); ratios are medians of per-round ratios. {load_text(summary)}.\n\n" + "\n".join(lines)
            + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
