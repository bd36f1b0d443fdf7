"""Our whole layer as built by several commits, or run under several allocators, side by side: time and peak RSS,
interleaved call by call (issue 23: what each memory cut saves and costs; which allocator to keep).

    python benchmarks/layer_versions.py --variant before=REV after=REV[:ALLOCATOR] ... \
        [--lengths 8k 32k] [--repeats 3] [--out benchmarks/results] [--name NAME]

A variant is ``LABEL=REV`` or ``LABEL=REV:ALLOCATOR``: the package ``transformer_vq/`` of git revision ``REV``
(extracted with ``git archive``; ``WORKTREE`` for the checkout as it is) in its own worker process
(benchmarks/layer_worker.py and its protocol from this checkout), with host memory handled by ``ALLOCATOR``:

- ``glibc`` (the default): the C library's malloc as it comes;
- ``retained``: glibc told to keep freed memory (``mallopt``; transformer_vq/hostmem.py, ``--retain-host-memory``);
- ``jemalloc`` / ``tcmalloc``: the allocator preloaded (``LD_PRELOAD``; Debian's libjemalloc2, libtcmalloc-minimal4).

Every worker holds the same unit (jax_layer.py's: D_m 768, D_k 128, D_v 1536, S 512, L 512, fp32, batch 1) and input.
Each round runs both modes (``fwd``, ``fwdbwd``) on every worker, the first worker rotating from round to round; a
call's peak is its worker's RSS high-water mark over that call. The table gives per length, mode and variant the
median seconds, the median over rounds of the first variant's time over this one's (same round, same load), the
highest peak RSS and rise over its calls and the peak against the first variant's; and the others' load meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jax_layer import HERE, interleave, layer_length, ours_worker, save_unit
from result_files import write_result
from worker_protocol import MODES

from transformer_vq.bench.load import load_text
from transformer_vq.bench.machine import load_average, machine_info
from transformer_vq.config.flags import file_stem, int_at_least, not_empty

ROOT = HERE.parent
PRELOADS = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
ALLOCATORS = ("glibc", "retained", *PRELOADS)


def parse_variant(text: str) -> dict:
    """``LABEL=REV[:ALLOCATOR]`` as ``{"label", "rev", "allocator"}``."""
    label, sep, rest = text.partition("=")
    rev, _, allocator = rest.partition(":")
    allocator = allocator or "glibc"
    if not sep or not label or not rev or allocator not in ALLOCATORS:
        raise SystemExit(f"error: --variant takes LABEL=REV[:ALLOCATOR] with ALLOCATOR one of {', '.join(ALLOCATORS)}, "
                         f"got {text!r}")
    return {"label": label, "rev": rev, "allocator": allocator}


def preload_path(name: str) -> str:
    """The file of a preloadable allocator (``ldconfig -p``), or a message saying how to install it."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        if line.strip().startswith(PRELOADS[name] + " "):
            return line.rsplit("=>", 1)[1].strip()
    raise SystemExit(f"error: {PRELOADS[name]} is not installed (apt-get install libjemalloc2 libtcmalloc-minimal4)")


def package_tree(rev: str, work: Path) -> tuple[Path, str]:
    """A folder whose ``transformer_vq/`` is that of ``rev`` (this checkout for ``WORKTREE``), and its commit."""
    if rev == "WORKTREE":
        return ROOT, "WORKTREE"
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tree = work / commit.strip()
    if not tree.exists():
        tree.mkdir()
        archive = subprocess.run(["git", "archive", commit.strip(), "transformer_vq"], cwd=ROOT, capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree, commit.strip()


def variant_env(tree: Path, allocator: str) -> dict:
    """A worker's environment: the package from ``tree`` first on the path, the allocator preloaded if it is one."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("LD_PRELOAD", None)
    if allocator in PRELOADS:
        env["LD_PRELOAD"] = preload_path(allocator)
    return env


def rows_of(run: dict, variants: list[dict], length: int, log) -> list[dict]:
    """Per mode and variant: median seconds, paired speedup and memory against the first variant."""
    base = variants[0]["label"]
    rows = []
    for mode in MODES:
        first = run["samples"][base, mode]
        base_peak = max(p["peak_rss_bytes"] for p in run["peaks"][base, mode])
        for v in variants:
            times, peaks = run["samples"][v["label"], mode], run["peaks"][v["label"], mode]
            peak = max(p["peak_rss_bytes"] for p in peaks)
            row = {"T": length, "mode": mode, **v, "seconds": statistics.median(times), "samples": times,
                   "speedup": statistics.median(a / b for a, b in zip(first, times)), "peak_rss_bytes": peak,
                   "peak_rss_rise_bytes": max(p["peak_rss_rise_bytes"] or 0 for p in peaks),
                   "memory_vs_first": peak / base_peak, "others_load": run["others_load"]}
            rows.append(row)
            log(f"T={length} {mode} {v['label']:>12}: {row['seconds']:.3f} s ({row['speedup']:.2f}x), peak RSS "
                f"{peak / 2**30:.2f} GiB ({row['memory_vs_first']:.2f}x); {load_text(run['others_load'])}")
    return rows


def table(result: dict) -> str:
    """The markdown report."""
    first = result["variants"][0]["label"]
    lines = [f"### Whole layer by variant (D_m 768, D_k 128, D_v 1536, S 512, L 512, fp32, batch 1, eval mode; "
             f"median of {result['repeats']}, interleaved call by call)", "",
             f"| T | mode | variant | revision | allocator | seconds | speedup vs {first} | peak RSS (GiB) "
             f"| rise (GiB) | memory vs {first} | others' load (mean / max) |",
             "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        load = r["others_load"]
        lines.append(f"| {r['T']} | {r['mode']} | {r['label']} | `{r['commit'][:9]}` | {r['allocator']} "
                     f"| {r['seconds']:.3f} | {r['speedup']:.2f}x | {r['peak_rss_bytes'] / 2**30:.2f} "
                     f"| {r['peak_rss_rise_bytes'] / 2**30:.2f} | {r['memory_vs_first']:.2f}x "
                     f"| {load['others_runnable_mean']} / {load['others_runnable_max']} |")
    m = result["machine"]
    lines += ["", "Speedup: the first variant's time over this one's in the same round (median over rounds); memory: "
                  "this variant's peak RSS over the first's.", "",
              f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, torch threads {m['torch_threads']}, torch "
              f"{m['torch']}, load {m['load_average_start']} -> {result['load_average_end']}; run from "
              f"`{m['commit']}`; {m['date_utc']}.", "", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", type=not_empty, nargs="+", required=True,
                        help="LABEL=REV[:ALLOCATOR], the first the baseline")
    parser.add_argument("--lengths", type=layer_length, nargs="+", default=[8192, 32768],
                        help="sequence lengths, 8k = 8192 (default: 8k 32k)")
    parser.add_argument("--repeats", type=int_at_least(1), default=3)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--name", type=file_stem, default=None, help="default: layer-versions-DATE")
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if len({v["label"] for v in variants}) != len(variants):
        raise SystemExit("error: --variant labels must differ")
    lengths = args.lengths
    machine = machine_info(measure_peak=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        save_unit(args.seed, work)
        workers = {}
        try:
            for v in variants:
                tree, v["commit"] = package_tree(v["rev"], work)
                workers[v["label"]] = ours_worker(work, 1, env=variant_env(tree, v["allocator"]),
                                                  retain=v["allocator"] == "retained")
            rows = [row for length in lengths
                    for row in rows_of(interleave(workers, length, args.repeats), variants, length, print)]
        finally:
            for worker in workers.values():
                worker.close()
    result = {"benchmark": "layer-versions", "variants": variants, "lengths": lengths, "repeats": args.repeats,
              "rows": rows, "machine": machine, "load_average_end": load_average(),
              "command": "python benchmarks/layer_versions.py " + " ".join(map(shlex.quote, argv or sys.argv[1:]))}
    write_result(result, table(result), args.out, args.name or f"layer-versions-{machine['date_utc'][:10]}")
    return result


if __name__ == "__main__":
    main()
