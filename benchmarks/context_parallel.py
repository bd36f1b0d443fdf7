"""Context parallelism of VQ attention on CPU (gloo): what it sends, and what it costs in time and memory per rank.

    PYTHONPATH=$PWD python benchmarks/context_parallel.py --bytes     # bytes per layer, 2 processes (the docs' table)
    PYTHONPATH=$PWD python benchmarks/context_parallel.py             # time and peak memory, 64k-256k tokens

``--bytes`` runs one attention call (one layer) forward and backward over 2 gloo processes at several sequence
lengths and counts, with a wrapper around ``torch.distributed.all_gather`` and ``all_reduce``, the bytes each rank
hands to a collective; beside them, ring attention's volume from its formula at the same sizes (docs/distributed.md).
Counting, not timing: the machine's load does not change it.

The default mode trains the ``small`` preset's model (``--layers`` of it) for ``--steps`` forward and backward passes
on one sequence of each length: once in one process, once split over 2 processes with ``context_parallel``. It
reports per rank the median time of a step and the peak resident set size (``ru_maxrss``). A timing: run it on an
otherwise idle machine. Both modes print the others' load while the processes ran (runnable threads of processes
other than the benchmark's, :mod:`transformer_vq.bench.load`). Results go to a JSON file with the machine, commit and
library versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import add_preset_flag, int_at_least, not_empty
from transformer_vq.hostmem import meminfo_bytes

REPO = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def spawn_watched(fn, nprocs: int, *args) -> tuple[list, dict]:
    """:func:`spawn`, and the others' load meanwhile (printed, and returned as a summary)."""
    with OthersLoad() as load:
        results = spawn(fn, nprocs, *args)
    print(f"    {load_text(load.summary())}")
    return results, load.summary()


def spawn(fn, nprocs: int, *args) -> list:
    """``fn(rank, nprocs, *args)`` in ``nprocs`` gloo processes; their results in rank order."""
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_entry, args=(nprocs, folder, fn, args), nprocs=nprocs, join=True)
        return [torch.load(Path(folder) / f"{rank}.pt", weights_only=False) for rank in range(nprocs)]


def _entry(rank, nprocs, folder, fn, args):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store", nprocs), rank=rank, world_size=nprocs)
    try:
        torch.save(fn(rank, nprocs, *args), Path(folder) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


# ---- bytes ---------------------------------------------------------------------------------------------------------

def count_bytes(rank, ranks, length, dims):
    """Bytes this rank hands to each collective during one forward and backward of one attention call."""
    from transformer_vq.ops.vq.context_parallel import vq_attention_context_parallel

    B, G, S, L, Dk, Dv = dims
    sent = {"all_gather": 0, "all_reduce": 0}
    originals = {name: getattr(dist, name) for name in sent}

    def counting(name):
        def call(*args, **kwargs):
            tensor = args[1] if name == "all_gather" else args[0]  # all_gather(outputs, input), all_reduce(tensor)
            sent[name] += tensor.numel() * tensor.element_size()
            return originals[name](*args, **kwargs)
        return call

    gen = torch.Generator().manual_seed(rank)
    T = length // ranks
    codebook = torch.randn(G, S, Dk, generator=gen)
    z = torch.randint(0, S, (B, G, T), generator=gen)
    k_hat = codebook[torch.arange(G)[None, :, None], z].requires_grad_()
    q = torch.randn(B, G, T, Dk, generator=gen, requires_grad=True)
    v = torch.randn(B, G, T, Dv, generator=gen, requires_grad=True)
    bias = torch.randn(B, G, T, 2 * L, generator=gen, requires_grad=True)
    for name in sent:
        setattr(dist, name, counting(name))
    try:
        out, _ = vq_attention_context_parallel(q, k_hat, v, bias, block_len=L, group=None, z=z, codebook=codebook)
        out.sum().backward()
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return sent


def bytes_table(args) -> dict:
    from transformer_vq.config import preset

    cfg = preset(args.preset)
    B, G, S, L, Dk, Dv = 1, 1, cfg.n_code, cfg.block_len, cfg.d_k, cfg.d_v
    rows = []
    for length in args.lengths:
        per_rank, load = spawn_watched(count_bytes, 2, length, (B, G, S, L, Dk, Dv))
        sent = per_rank[1]
        ring = (2 - 1) * length // 2 * (Dk + Dv) * B * G * 4  # float32 keys and values passed once around the ring
        rows.append({"tokens": length, "cp_forward_bytes": sent["all_gather"], "cp_backward_bytes": sent["all_reduce"],
                     "ring_forward_bytes": ring, "ring_backward_bytes": 2 * ring, **load})
        print(f"T={length:>7}: context parallel {sent['all_gather']:>9,} B forward, {sent['all_reduce']:>9,} B "
              f"backward; ring attention {ring:>12,} B forward, {2 * ring:>12,} B backward (per rank, one layer)")
    return {"dims": {"B": B, "G": G, "S": S, "L": L, "Dk": Dk, "Dv": Dv, "dtype": "float32"}, "rows": rows}


# ---- time and memory -----------------------------------------------------------------------------------------------

def train_steps(rank, ranks, length, args):
    """Median seconds of a forward and backward pass on this rank's chunk of one sequence, and the peak RSS."""
    from transformer_vq.config import preset
    from transformer_vq.models.tvq.model import TransformerVQ

    torch.manual_seed(0)
    model = TransformerVQ(preset(args.preset, n_layers=args.layers)).train()
    ids = torch.randint(0, 256, (1, length + 1), generator=torch.Generator().manual_seed(1))
    chunk = length // ranks
    lo = rank * chunk
    group = dist.group.WORLD if ranks > 1 else None
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        out = model(ids[:, lo:lo + chunk], targets=ids[:, lo + 1:lo + chunk + 1], context_parallel=group)
        (out.loss / ranks).backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return {"step_s": statistics.median(times),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def available_mib() -> float:
    """Memory the kernel could give a new process now (``MemAvailable``), in MiB (infinite where unknown)."""
    available = meminfo_bytes("MemAvailable")
    return float("inf") if available is None else available / 2**20


def timing_table(args, save) -> dict:
    """Time each length at 1 and 2 processes; ``save(result)`` after every run, so a run cut short keeps what it
    measured. A run whose memory, extrapolated linearly from the same process count at the longest length measured,
    would not fit in the memory available now is skipped with its estimate (it would be killed, or swap)."""
    rows = []
    for length in args.lengths:
        for ranks in (1, 2):
            done = [r for r in rows if r["processes"] == ranks and "peak_rss_mib" in r]
            if done:
                longest = max(r["tokens"] for r in done)
                need = sum(r["peak_rss_mib"] for r in done if r["tokens"] == longest) * length / longest
                available = available_mib()  # read once: the row and the message give the same figure
                if need > available:
                    rows.append({"tokens": length, "processes": ranks, "status": "skipped",
                                 "estimated_peak_rss_mib_all_ranks": round(need), "available_mib": round(available)})
                    print(f"T={length:>7} processes={ranks}: skipped, about {need:,.0f} MiB over all ranks needed, "
                          f"{available:,.0f} MiB available")
                    save({"rows": rows})
                    continue
            per_rank, load = spawn_watched(train_steps, ranks, length, args)
            for rank, result in enumerate(per_rank):
                rows.append({"tokens": length, "processes": ranks, "rank": rank, **result, **load})
                print(f"T={length:>7} processes={ranks} rank={rank}: {result['step_s']:.2f} s/step, "
                      f"peak RSS {result['peak_rss_mib']:,.0f} MiB")
            save({"rows": rows})
    return {"rows": rows}


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", action="store_true", help="count the bytes of the collectives instead of timing")
    add_preset_flag(parser, "small")
    parser.add_argument("--layers", type=int_at_least(1), default=2, help="layers of the timed model")
    parser.add_argument("--steps", type=int_at_least(1), default=3, help="timed forward and backward passes per run")
    parser.add_argument("--lengths", type=int_at_least(1), nargs="+", default=None, help="sequence lengths in tokens")
    parser.add_argument("--out", type=not_empty, default=None,
                        help="JSON file of the results (default: benchmarks/results/...)")
    parser.set_defaults(preset="small")
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = [4096, 16384, 65536] if args.bytes else [65536, 131072, 262144]
    name = "context_parallel_bytes.json" if args.bytes else "context_parallel_timing.json"
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / name
    head = {"command": command_line(), "machine": machine(), "args": vars(args)}

    def save(table: dict) -> None:
        out.write_text(json.dumps({**head, **table}, indent=2) + "\n")

    save(bytes_table(args) if args.bytes else timing_table(args, save))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
