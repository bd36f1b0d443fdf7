"""What a benchmark result must record about where it ran, and the machine's matmul throughput measured in the same run.

The matmul GFLOP/s is the yardstick of every achieved-GFLOP/s figure: it is measured with the same library, threads and
load as the benchmark itself, so "fraction of peak" means fraction of what a dense matmul reaches here and now.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from transformer_vq.hostmem import meminfo_bytes


def synchronizer(device: str = "cpu"):
    """A call that waits until the device has finished its queued work: CUDA runs asynchronously, so a timer read
    without it measures the launches, not the work (a no-op on a CPU)."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def median_seconds(fn, *, repeats: int, warmup: int = 1, device: str = "cpu") -> tuple[float, list[float]]:
    """Median wall time of ``fn()`` on ``device`` over ``repeats`` runs after ``warmup`` untimed runs, and every
    sample."""
    sync = synchronizer(device)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def matmul_gflops(dtype: torch.dtype = torch.float32, max_size: int = 2048, repeats: int = 5,
                  probe_s: float = 0.05, device: str = "cpu") -> float:
    """Median GFLOP/s of a square matmul (``2 n^3`` FLOPs) in ``dtype`` on ``device`` (a GPU's: up to ``n = 8
    max_size``, enough work to fill it).

    ``n`` doubles from 256 up to ``max_size`` while one product takes under ``probe_s``: a CPU without
    native bfloat16 (AVX2 only) needs ~90 s for one 2048 x 2048 bfloat16 product, so a fixed size could
    stall every benchmark; the rate of a large enough product does not depend on its size.
    """
    size, sync = 256, synchronizer(device)
    max_size *= 1 if device == "cpu" else 8
    while True:
        # drawn where they are multiplied: a GPU's 16k x 16k operands drawn on the CPU took seconds each, every cell
        # of a benchmark measures this rate, and on an H100 the draws alone ran the GPU tests past their limits
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, generator=gen, device=device, dtype=dtype)
        b = torch.randn(size, size, generator=gen, device=device, dtype=dtype)
        out = torch.empty(size, size, dtype=dtype, device=device)
        if device != "cpu":
            torch.mm(a, b, out=out)  # a GPU's first product of a size pays for library setup and kernel selection
        sync()
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        if size >= max_size or time.perf_counter() - start >= probe_s:
            break
        size *= 2
    # the last probe ran this product once already: no further warm-up
    seconds, _ = median_seconds(lambda: torch.mm(a, b, out=out), repeats=repeats, warmup=0, device=device)
    return 2 * size**3 / seconds / 1e9


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    """The vector-extension flags that decide matmul speed (AVX-512, BF16, AMX)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx512f", "avx512_bf16", "amx", "avx2", "fma")))
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    total = meminfo_bytes("MemTotal")
    return None if total is None else round(total / 2**30, 1)


def git_commit() -> dict:
    """The commit of the working tree the benchmark ran from, and whether tracked files differed from it."""
    root = Path(__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "transformer_vq"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": dirty}


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (how busy the machine was: the CPU may be shared)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(*, measure_peak: bool = True) -> dict:
    """Machine, software and commit of this run, with the fp32 and bf16 matmul GFLOP/s measured now."""
    import numpy

    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": platform.node(),
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": _memory_gib(),
        "load_average_start": load_average(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        # the GPUs a benchmark on --device cuda ran on (none: an empty list)
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        **git_commit(),
    }
    if measure_peak:
        info["matmul_gflops"] = {
            "float32": round(matmul_gflops(torch.float32), 1),
            "bfloat16": round(matmul_gflops(torch.bfloat16), 1),
        }
    return info
