"""Run a function in several gloo processes on CPU and collect what each returns (tests of collectives).

``pytest`` puts ``tests/`` on ``sys.path`` (prepend import mode, through ``tests/conftest.py``), so any test imports
this as ``distutil``. The function must be defined at the top level of an importable module (spawned processes
import it by name)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_gloo(fn, nprocs: int, tmp_path: Path, *args) -> list:
    """``[fn(rank, nprocs, *args) for every rank]``, each called in its own process of one gloo group."""
    mp.spawn(_entry, args=(nprocs, str(tmp_path), fn, args), nprocs=nprocs, join=True)
    return [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(nprocs)]


def _entry(rank: int, nprocs: int, folder: str, fn, args) -> None:
    torch.set_num_threads(1)  # the processes share the machine's cores
    store = dist.FileStore(str(Path(folder) / "store"), nprocs)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nprocs)
    try:
        result = fn(rank, nprocs, *args)
        torch.save(result, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
