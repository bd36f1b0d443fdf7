"""Data-parallel setup for runs started by ``torchrun`` (one process per worker).

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them a run is a single process
and every collective here is a no-op, so the training loop has one code path for both cases.
Backend: ``nccl`` when the run uses CUDA, ``gloo`` on CPU. FSDP (``parallel="fsdp"``) needs a process
group even for one process (its sharding runs over a device mesh), so without torchrun it joins a
group of one through an in-memory store; the run and its checkpoints are then those of a
one-worker FSDP run (resumable by any number of workers, see docs/distributed.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    """Where this process sits among the data-parallel workers."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False
    """Parameters, gradients and optimizer state are sharded over the workers (FSDP2)."""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, metrics and the console output."""
        return self.rank == 0

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over workers, in place (a no-op for one process)."""
        if self.enabled:
            for tensor in tensors:
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def all_gather_object(self, obj) -> list:
        """``obj`` from every worker, in rank order (``[obj]`` for one process)."""
        if not self.enabled:
            return [obj]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup_distributed(device_type: str, parallel: str = "ddp") -> Distributed:
    """Join the process group described by torchrun's environment variables, if any (for FSDP, a
    group of one without them)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    fsdp = parallel == "fsdp"
    if world_size == 1 and not fsdp:
        return Distributed()
    backend = "nccl" if device_type == "cuda" else "gloo"
    if world_size == 1:
        rank = local_rank = 0
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, fsdp=fsdp)


def data_parallel(model: torch.nn.Module, info: Distributed, device: torch.device, *,
                  find_unused: bool) -> torch.nn.Module:
    """The module a training step calls: DDP's wrapper of ``model`` when several DDP workers share it,
    else ``model`` itself (one process, or FSDP, which shards the model in place)."""
    if not info.enabled or info.fsdp:
        return model
    # codebooks stay identical without broadcasting buffers: every worker applies the same
    # update from all-reduced statistics
    return torch.nn.parallel.DistributedDataParallel(
        model, broadcast_buffers=False, find_unused_parameters=find_unused,
        device_ids=[device.index] if device.type == "cuda" else None,
    )


def teardown_distributed(info: Distributed) -> None:
    if (info.enabled or info.fsdp) and dist.is_initialized():
        dist.destroy_process_group()
