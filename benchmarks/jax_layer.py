"""Our whole layer against the authors' JAX layer on this CPU, interleaved call by call (issue: at least 2x at 8k
and 32k, fwd and fwd+bwd; time linear in T).

    TVQ_AUTHORS=GIT_DIR_OR_SOURCE TVQ_JAX_PYTHON=/path/to/jax/venv/bin/python \
        python benchmarks/jax_layer.py [--lengths 2k 8k 32k] [--repeats 7] [--out benchmarks/results]

One gated attention unit of the enwik8 preset (D_m 768, D_k 128, D_v 1536, S 512, L 512, float32, batch 1,
``bias_span="block"`` so both compute the same function), with the same parameters on both sides. Each side lives in
its own persistent process (benchmarks/layer_worker.py; benchmarks/jax_side/worker.py: the authors' branch
``optimized``, whole-sequence layer, serial reduction), built and warmed up once per length. Then, ``repeats`` times,
every mode's call goes to one side and then the other (the first side alternates), so both see the same machine
state; the figure is the median. Each call also reports its worker's peak RSS (the high-water mark reset right before
it; transformer_vq/bench/memory.py): the table gives each side's highest over its timed calls of a mode, and the
others' load (runnable threads of other processes) sampled meanwhile. Prints a markdown table (seconds, speedup =
authors' time / ours, peak RSS of both sides, growth from 8k to 32k), a second one setting both sides against the
fp32 matmul rate (the FLOPs of the layer's products per second, and the share of the rate that twice the authors'
speed would need), and writes ``NAME.json`` and ``NAME.md`` under ``--out`` with the machine, commits and versions.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from authors_bridge import (add_authors_flags, authors_params, authors_source, gau_config, jax_env, randomize,
                            require_authors)
from result_files import write_result
from transformer_vq import GatedAttentionUnit
from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import load_average, machine_info, matmul_gflops
from transformer_vq.config import PRESETS
from transformer_vq.config.fields import parse_scalar
from transformer_vq.config.flags import file_stem, int_at_least, not_empty
from worker_protocol import MODES

HERE = Path(__file__).resolve().parent
SIDES = ("ours", "authors")


class Worker:
    """One persistent worker process and its request/reply lines."""

    def __init__(self, command: list[str], env: dict | None = None, cwd: Path | None = None):
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=cwd)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"error: worker {self.proc.args[1]} ended (exit status {self.proc.wait()})")
        message = json.loads(line)
        if "error" in message:
            raise SystemExit(f"error: worker {self.proc.args[1]}: {message['error']}")
        return message

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def save_unit(seed: int, work: Path) -> tuple[GatedAttentionUnit, dict]:
    """The unit of the comparison with its parameters drawn from ``seed``, saved as ``work/unit.pt`` and
    ``work/config.json`` for the workers; and its dimensions."""
    dims = {k: getattr(PRESETS["enwik8"], k) for k in ("d_model", "d_k", "n_code", "block_len", "max_wavelength")}
    cfg = gau_config(dims, bias_span="block")
    torch.manual_seed(seed)
    unit = GatedAttentionUnit(cfg).eval()
    randomize(unit, seed)
    torch.save(unit.state_dict(), work / "unit.pt")
    (work / "config.json").write_text(json.dumps(cfg.to_dict()))
    return unit, dims


def ours_worker(work: Path, batch: int, env: dict | None = None, retain: bool = False) -> Worker:
    """Our side's worker (benchmarks/layer_worker.py) on the unit :func:`save_unit` wrote; ``env``: its environment
    (default: ours); ``retain``: keep freed host memory for reuse (transformer_vq/hostmem.py)."""
    return Worker([sys.executable, str(HERE / "layer_worker.py"), "--state", str(work / "unit.pt"), "--config",
                   str(work / "config.json"), "--batch", str(batch), *(["--retain-host-memory"] if retain else [])],
                  env=env)


def start_workers(args, work: Path) -> tuple[dict[str, Worker], dict]:
    """Both workers, holding the same parameters: a unit built here, saved for ours, translated for the authors'."""
    unit, dims = save_unit(args.seed, work)
    np.savez(work / "params.npz", dims=json.dumps(dims), **{f"param:{k}": v.astype(np.float32)
                                                            for k, v in authors_params(unit).items()})
    src, commit = authors_source(args.authors, work / "authors")
    ours = ours_worker(work, args.batch)
    authors = Worker([args.jax_python, str(HERE / "jax_side" / "worker.py"), "--src", str(src), "--params",
                      str(work / "params.npz"), "--batch", str(args.batch)], env=jax_env(), cwd=HERE / "jax_side")
    setup = {"dims": dims, "d_v": unit.cfg.d_v, "bias_span": "block", "reduction": "serial", "precision": "float32",
             "batch": args.batch, "authors_branch": "optimized", "authors_commit": commit}
    return {"ours": ours, "authors": authors}, setup


def interleave(workers: dict[str, Worker], length: int, repeats: int, count_with: str | None = None) -> dict:
    """Every worker's calls of length ``length``, interleaved call by call: each round runs every mode on every
    worker, the first worker rotating from round to round. Returns each worker's warm-up reply and, per (worker,
    mode), the seconds and peaks of its timed calls, and the others' load meanwhile; with ``count_with``, also the
    FLOPs of each mode as that worker counts them (once, untimed, after the rounds: counting before them left the
    worker 0.2-0.3 GiB more resident memory in every timed call) and the fp32 matmul rate, measured in every round
    (the host's share moves from round to round more than the load inside the machine shows)."""
    names = list(workers)
    warmup = {name: workers[name].ask(cmd="prepare", T=length) for name in names}
    samples = {(name, mode): [] for name in names for mode in MODES}
    peaks = {(name, mode): [] for name in names for mode in MODES}
    rates = []
    with OthersLoad() as load:
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for mode in MODES:
                for name in order:
                    reply = workers[name].ask(cmd="run", T=length, mode=mode)
                    samples[name, mode].append(reply["seconds"])
                    peaks[name, mode].append(reply["peak"])
            if count_with:
                rates.append(matmul_gflops(torch.float32) * 1e9)
    flops = workers[count_with].ask(cmd="flops", T=length)["flops"] if count_with else None
    for name in names:
        workers[name].ask(cmd="drop", T=length)
    return {"warmup": warmup, "samples": samples, "peaks": peaks, "others_load": load.summary(), "flops": flops,
            "matmul_flops_per_s": rates}


def measure(workers: dict[str, Worker], length: int, repeats: int, log) -> list[dict]:
    """The rows of one length: each mode's samples on both sides, interleaved call by call, and each side's share of
    the fp32 matmul rate (the median of its measurement in every round), with what twice the authors' speed would
    need: the FLOPs of our call (its matrix products, benchmarks/flops.py; the authors' layer computes the same
    function, and its share is taken at our count) over half the authors' time."""
    run = interleave(workers, length, repeats, count_with="ours")
    samples, peaks, warmup, load = run["samples"], run["peaks"], run["warmup"], run["others_load"]
    rate = statistics.median(run["matmul_flops_per_s"])
    rows = []
    for mode in MODES:
        ours, theirs = (statistics.median(samples[side, mode]) for side in SIDES)
        flops = run["flops"][mode]
        # each side's peak RSS over its timed calls of this mode (the warm-up's is kept apart: it compiles)
        peak = {side: max(p["peak_rss_bytes"] for p in peaks[side, mode]) for side in SIDES}
        rows.append({"T": length, "mode": mode, "ours_s": ours, "authors_s": theirs, "speedup": theirs / ours,
                     "ours_peak_rss_bytes": peak["ours"], "authors_peak_rss_bytes": peak["authors"],
                     "memory_ratio": peak["ours"] / peak["authors"], "others_load": load,
                     "flops": flops, "matmul_flops_per_s": rate,
                     "matmul_samples": run["matmul_flops_per_s"], "ours_of_matmul": flops / ours / rate,
                     "authors_of_matmul": flops / theirs / rate, "twice_authors_needs": 2 * flops / theirs / rate,
                     "ours_samples": samples["ours", mode], "authors_samples": samples["authors", mode],
                     "ours_peaks": peaks["ours", mode], "authors_peaks": peaks["authors", mode],
                     "warmup_s": {side: warmup[side]["warmup_s"][mode] for side in SIDES},
                     "warmup_peak": {side: warmup[side]["warmup_peak"][mode] for side in SIDES}})
        log(f"T={length} {mode}: {flops / 1e9:.1f} GFLOP of products, matmul {rate / 1e9:.1f} GFLOP/s: ours at "
            f"{flops / ours / rate:.0%} of it, authors at {flops / theirs / rate:.0%}; twice the authors' speed needs "
            f"{2 * flops / theirs / rate:.0%}")
        log(f"T={length} {mode}: ours {ours:.3f} s, authors {theirs:.3f} s, speedup {theirs / ours:.2f}x; peak RSS "
            f"ours {peak['ours'] / 2**30:.2f} GiB, authors {peak['authors'] / 2**30:.2f} GiB; {load_text(load)}")
    return rows


def growth(rows: list[dict], low: int, high: int) -> dict:
    """Time at ``high`` over time at ``low`` per mode and side (linear time: ``high / low``)."""
    by = {(r["T"], r["mode"]): r for r in rows}
    return {mode: {side: by[high, mode][f"{side}_s"] / by[low, mode][f"{side}_s"] for side in SIDES}
            for mode in MODES if (low, mode) in by and (high, mode) in by}


def table(result: dict) -> str:
    """The markdown report: seconds per call, speedups, and the growth from 8k to 32k."""
    s = result["setup"]
    lines = [f"### Whole layer, ours vs the authors' JAX layer (D_m {s['dims']['d_model']}, D_k {s['dims']['d_k']}, "
             f"D_v {s['d_v']}, S {s['dims']['n_code']}, L {s['dims']['block_len']}, fp32, batch {s['batch']}; "
             f"median of {result['repeats']}, interleaved)", "",
             "| T | mode | ours (s) | authors' JAX (s) | speedup (authors / ours) | peak RSS ours (GiB) "
             "| peak RSS authors' (GiB) | memory (ours / authors) | others' load (mean / max runnable) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        load = r.get("others_load", {})
        lines.append(f"| {r['T']} | {r['mode']} | {r['ours_s']:.4f} | {r['authors_s']:.4f} | {r['speedup']:.2f}x "
                     f"| {r['ours_peak_rss_bytes'] / 2**30:.2f} | {r['authors_peak_rss_bytes'] / 2**30:.2f} "
                     f"| {r['memory_ratio']:.2f}x | {load.get('others_runnable_mean')} / "
                     f"{load.get('others_runnable_max')} |")
    lines += ["", "Against the fp32 matmul rate (median of a measurement in every round): the FLOPs of the layer's "
                  "matrix products (counted on our side; the authors' layer computes the same function, and its "
                  "column uses our count) per second of each side, and the share of the rate that twice the authors' "
                  "speed would need (over 100%: out of reach on this machine, however little else the layer did).", "",
              "| T | mode | GFLOP | matmul GFLOP/s | ours | authors' | 2x the authors' needs |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['T']} | {r['mode']} | {r['flops'] / 1e9:.1f} | {r['matmul_flops_per_s'] / 1e9:.1f} "
              f"| {r['ours_of_matmul']:.0%} | {r['authors_of_matmul']:.0%} | {r['twice_authors_needs']:.0%} |"
              for r in result["rows"]]
    if result["growth"]:
        low, high = result["growth_lengths"]
        lines += ["", f"Growth of the time from T = {low} to T = {high} (linear: {high / low:g}x):", "",
                  "| mode | ours | authors' JAX |", "|---|---:|---:|"]
        lines += [f"| {mode} | {g['ours']:.2f}x | {g['authors']:.2f}x |" for mode, g in result["growth"].items()]
    m = result["machine"]
    lines += ["", f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, torch threads {m['torch_threads']}, load "
                  f"{m['load_average_start']} -> {result['load_average_end']}; fp32 matmul "
                  f"{m.get('matmul_gflops', {}).get('float32')} GFLOP/s. Ours at `{m['commit']}` (torch "
                  f"{m['torch']}); authors' `{s['authors_branch']}` at `{s['authors_commit']}` (jax "
                  f"{result['authors_versions'].get('jax')}, flax {result['authors_versions'].get('flax')}).",
              "", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def layer_length(text: str) -> int:
    """The type of ``--lengths``: one length as given on the command line (``8k`` = 8192), a multiple of the block
    length 512 and at least three blocks; refused while parsing (exit status 2) otherwise."""
    try:
        length = parse_scalar(text, int, {"k_suffix": True})
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if length % 512 or length // 512 < 3:
        raise argparse.ArgumentTypeError(f"must be a multiple of 512, at least 1536 (the authors' layer needs three "
                                         f"blocks), got {text!r}")
    return length


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_authors_flags(parser)
    parser.add_argument("--lengths", type=layer_length, nargs="+", default=[2048, 8192, 32768],
                        help="sequence lengths, 8k = 8192 (default: 2k 8k 32k)")
    parser.add_argument("--repeats", type=int_at_least(1), default=7)
    parser.add_argument("--batch", type=int_at_least(1), default=1)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results", help="folder of NAME.json and NAME.md")
    parser.add_argument("--name", type=file_stem, default=None, help="default: jax-layer-fp32-DATE-<cpus>cpu")
    args = parser.parse_args(argv)
    require_authors(args)
    lengths = args.lengths
    machine = machine_info()
    with tempfile.TemporaryDirectory() as tmp:
        workers, setup = start_workers(args, Path(tmp))
        try:
            rows = [row for length in lengths for row in measure(workers, length, args.repeats, log=print)]
        finally:
            for worker in workers.values():
                worker.close()
    pair = (8192, 32768) if {8192, 32768} <= set(lengths) else (min(lengths), max(lengths))
    result = {"benchmark": "jax-layer", "setup": setup, "lengths": lengths, "repeats": args.repeats, "rows": rows,
              "growth_lengths": pair, "growth": growth(rows, *pair) if len(lengths) > 1 else {},
              "authors_versions": workers["authors"].hello, "ours_versions": workers["ours"].hello,
              "machine": machine, "load_average_end": load_average(),
              "command": "python benchmarks/jax_layer.py " + " ".join(map(shlex.quote, argv or sys.argv[1:]))}
    write_result(result, table(result), args.out,
                 args.name or f"jax-layer-fp32-{machine['date_utc'][:10]}-{machine['logical_cpus']}cpu")
    return result


if __name__ == "__main__":
    main()
