"""Peak memory (RSS) per worker of data-parallel training, DDP vs FSDP, 2 gloo workers on CPU.

    PYTHONPATH=$PWD python benchmarks/fsdp_memory.py                  # enwik8 preset (184M parameters)
    PYTHONPATH=$PWD python benchmarks/fsdp_memory.py --layers 14      # ~108M parameters

For each of ``--parallel ddp`` and ``fsdp`` it starts ``torchrun --nproc_per_node 2`` on this file;
every worker builds the training exactly as ``tvq train`` does (the library's trainer: model,
sharding or DDP wrapper, AdamW), runs a few optimizer steps on short windows, and reports its peak
resident set size (``ru_maxrss``) after the build and after the steps. Checkpoints, evaluation
and sampling are left out: the figure is what training itself needs. The windows are short so that
activations are small next to weights, gradients and Adam state (the part FSDP shards). Results go
to a JSON file with the machine, commit and versions, and the per-worker estimate of
docs/distributed.md for comparison. A memory measurement: machine load does not change it.

Each is run twice: with glibc's default allocator settings, and with ``MALLOC_MMAP_THRESHOLD_`` fixed
at 1 MiB. By default glibc raises its mmap threshold after large frees, so FSDP's per-unit gather
buffers (tens of MB, freed after every unit) come from the heap, fragment it, and stay counted in
the RSS although no tensor holds them; with the threshold fixed they are returned to the system at
once and the RSS tracks the live tensors (see docs/distributed.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def rss_peak_mib() -> float:
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_config(args, parallel: str, corpus: Path):
    from transformer_vq.config import load_config

    overrides = [f"n_layers={args.layers}", f"block_len={args.window}", f"seq_len={args.window}",
                 f"update_len={args.window}", f"batch_size={args.batch}", f"steps={args.steps}", "warmup_steps=1",
                 "data=text", f"data_path={corpus}", f"parallel={parallel}", "device=cpu", "lr=1e-4",
                 f"run_dir={corpus.parent / 'run'}"]
    return load_config(args.preset, overrides=overrides)


def worker(args) -> None:
    """One torchrun worker: build the training, run the steps, write this worker's figures."""
    import torch

    from transformer_vq.train.lm import LMTrainer  # the trainer of `tvq train`, without its checkpoints
    from transformer_vq.train.parallel.distributed import setup_distributed, teardown_distributed

    cfg = run_config(args, args.parallel, Path(args.corpus))
    info = setup_distributed("cpu", args.parallel)
    baseline = rss_peak_mib()
    trainer = LMTrainer(cfg, info, torch.device("cpu"), None)
    built = rss_peak_mib()

    losses = [trainer.train_step()["metrics"]["loss"] for _ in range(args.steps)]
    figures = {"rank": info.rank, "rss_peak_mib_before_build": round(baseline, 1),
               "rss_peak_mib_after_build": round(built, 1), "rss_peak_mib_after_steps": round(rss_peak_mib(), 1),
               "losses": losses, "parameters": sum(p.numel() for p in trainer.model.parameters())}
    Path(args.report, f"{args.variant}-{info.rank}.json").write_text(json.dumps(figures))
    del trainer  # DDP's reducer must go before its process group, or the exit hangs
    gc.collect()
    teardown_distributed(info)


def estimate_mib(parameters: int, parallel: str, workers: int) -> float:
    """Weights + gradients + AdamW's two moments in float32, per worker (DDP also keeps gradient
    buckets as large as the gradients); activations and the runtime are left out."""
    per_param = 4 * (4 + 1) if parallel == "ddp" else 4 * 4 / workers
    return parameters * per_param / MIB


def global_batch(text: str) -> int:
    """The type of ``--batch``: the global batch, split evenly over the 2 workers (the data loader refuses a batch
    that is not a multiple of the workers, after both have started)."""
    from transformer_vq.config.flags import int_at_least

    batch = int_at_least(2, "split over the 2 workers")(text)
    if batch % 2:
        raise argparse.ArgumentTypeError(f"must be even (split evenly over the 2 workers), got {text!r}")
    return batch


global_batch.bounds = {"min": 2, "max": None, "min_open": False, "max_open": False}  # as float_in keeps its bounds


def main() -> None:
    from transformer_vq.config.flags import add_preset_flag, int_at_least, not_empty

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_flag(parser, "enwik8")
    parser.add_argument("--layers", type=int_at_least(1), default=24, help="n_layers (the preset has 24)")
    parser.add_argument("--window", type=int_at_least(1), default=32, help="seq_len = update_len = block_len")
    parser.add_argument("--batch", type=global_batch, default=2, help="global batch size, even (2 workers)")
    parser.add_argument("--steps", type=int_at_least(1), default=3)
    parser.add_argument("--out", type=not_empty, default=None,
                        help="result JSON (default benchmarks/results/fsdp-memory-DATE.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parallel", type=not_empty, default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=not_empty, help=argparse.SUPPRESS)
    parser.add_argument("--variant", type=not_empty, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=not_empty, help=argparse.SUPPRESS)
    parser.set_defaults(preset="enwik8")
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    from transformer_vq.bench.machine import machine_info
    from transformer_vq.bench.result import command_line

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp, "text.txt")
        corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(4000)))
        workers = {}
        for allocator, extra_env in (("", {}), ("+mmap1m", {"MALLOC_MMAP_THRESHOLD_": str(MIB)})):
            env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra_env}
            for parallel in ("ddp", "fsdp"):
                variant = parallel + allocator
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           __file__, "--worker", "--parallel", parallel, "--variant", variant, "--corpus",
                           str(corpus), "--report", tmp,
                           *(f"--{k}={getattr(args, k)}" for k in ("preset", "layers", "window", "batch", "steps"))]
                subprocess.run(command, check=True, env=env, cwd=REPO)
                workers[variant] = [json.loads(Path(tmp, f"{variant}-{r}.json").read_text()) for r in range(2)]
    parameters = workers["ddp"][0]["parameters"]
    result = {
        "benchmark": "fsdp-memory",
        "command": command_line(),
        "config": {k: getattr(args, k) for k in ("preset", "layers", "window", "batch", "steps")} | {"workers": 2},
        "variants": {"ddp/fsdp": "glibc defaults", "ddp+mmap1m/fsdp+mmap1m": "MALLOC_MMAP_THRESHOLD_=1048576"},
        "parameters": parameters,
        "workers": workers,
        "estimate_mib_per_worker": {p: round(estimate_mib(parameters, p, 2), 1) for p in ("ddp", "fsdp")},
        "machine": machine_info(measure_peak=False),
    }
    out = Path(args.out or REPO / "benchmarks" / "results" / f"fsdp-memory-{result['machine']['date_utc'][:10]}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    for parallel, rows in workers.items():
        print(parallel, [row["rss_peak_mib_after_steps"] for row in rows], "MiB peak RSS per worker")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
