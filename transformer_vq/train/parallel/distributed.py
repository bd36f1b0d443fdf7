"""Data-parallel setup for runs started by ``torchrun`` (one process per worker).

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them a run is a single process
and every collective here is a no-op, so the training loop has one code path for both cases.
Backend: ``nccl`` when the run uses CUDA, ``gloo`` on CPU. FSDP (``parallel="fsdp"``) needs a process
group even for one process (its sharding runs over a device mesh), so without torchrun it joins a
group of one through an in-memory store; the run and its checkpoints are then those of a
one-worker FSDP run (resumable by any number of workers, see docs/distributed.md).

Context parallelism (``context_parallel`` N > 1) arranges the workers as a ``DeviceMesh`` of shape
``(world_size / N, N)`` named ``("dp", "cp")``: the N workers of a "cp" row read the same sequences, each a chunk of
every window in time, and hand each other VQ-attention states; the rows read different sequences. Gradients,
losses and codebook statistics are reduced over every worker (DDP, or FSDP2 sharding over the whole mesh), which is
right because each worker's loss is the mean over an equal share of the tokens.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from transformer_vq.config import ConfigError
from transformer_vq.data.batches import check_workers


@dataclass(frozen=True)
class Distributed:
    """Where this process sits among the data-parallel workers."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False
    """Parameters, gradients and optimizer state are sharded over the workers (FSDP2)."""
    context_parallel: int = 1
    """Workers that share each sequence, split along time (the "cp" dimension of the mesh)."""
    cp_group: Any = None
    """The process group of this worker's "cp" row (``None`` without context parallelism)."""

    @property
    def data_rank(self) -> int:
        """Which share of every batch's rows this worker reads (its "dp" index: the same along a "cp" row)."""
        return self.rank // self.context_parallel

    @property
    def data_world(self) -> int:
        """Number of shares the rows of a batch are split into."""
        return self.world_size // self.context_parallel

    @property
    def cp_rank(self) -> int:
        """Which chunk of every window this worker reads (its "cp" index)."""
        return self.rank % self.context_parallel

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

    def any_(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` is true on any worker (one all-reduce, on ``device``: nccl reduces only GPU tensors)."""
        if not self.enabled:
            return flag
        count = torch.tensor([float(flag)], dtype=torch.float64, device=device)
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        return count.item() > 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def one_process(command: str) -> None:
    """Refuse (``ConfigError``) to run ``command`` (``"tvq eval runs"``) in a process torchrun started among others:
    each would do the whole job again, and print it again."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"{command} in one process; run it without torchrun")


def check_workers_of(train, resumed: bool) -> None:
    """Refuse (``ValueError``), before the corpus is read, a global batch (``train.batch_size``) that this launch's
    data-parallel workers (torchrun's ``WORLD_SIZE`` over ``train.context_parallel``) cannot share out; for a
    ``resumed`` run, which keeps its batch_size, naming the numbers of workers that can."""
    world, cp = int(os.environ.get("WORLD_SIZE", "1")), train.context_parallel
    if world % cp == 0:  # else the training refuses the split, naming both
        check_workers(train.batch_size, world // cp, kept=resumed, context_parallel=cp)


def setup_distributed(device_type: str, parallel: str = "ddp", context_parallel: int = 1,
                      timeout: float | None = None) -> Distributed:
    """Join the process group described by torchrun's environment variables, if any (for FSDP, a
    group of one without them); with ``context_parallel`` > 1, the "cp" rows of the workers' mesh. ``timeout``:
    seconds a collective of any of these groups waits for the other workers before it raises (None: the backend's
    default, 30 minutes for gloo, 10 for NCCL)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size % context_parallel != 0:
        raise ValueError(f"context_parallel {context_parallel} splits each sequence over that many torchrun workers, "
                         f"and this run has {world_size}: start it with torchrun --nproc_per_node set to a multiple of "
                         f"{context_parallel}, or lower --context-parallel")
    fsdp = parallel == "fsdp"
    if world_size == 1 and not fsdp:
        return Distributed()
    backend = "nccl" if device_type == "cuda" else "gloo"
    wait = timedelta(seconds=timeout) if timeout is not None else None
    if world_size == 1:
        rank = local_rank = 0
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=wait)
    else:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=wait)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    info = Distributed(rank=rank, world_size=world_size, local_rank=local_rank, fsdp=fsdp)
    if context_parallel == 1:
        return info
    # A group of its own for "cp", even when it spans every worker (the mesh would reuse the default group): the
    # state hand-off's collective runs inside the backward, where DDP's gradient all-reduces on the default group
    # may be issued in another order on another worker.
    # the mesh's groups do not inherit the default group's timeout (new_group falls back to the backend's default)
    override = backend if wait is None else (backend, group_options(backend, wait))
    mesh = init_device_mesh(device_type, (world_size // context_parallel, context_parallel),
                            mesh_dim_names=("dp", "cp"), backend_override={"dp": override, "cp": override})
    return dataclasses.replace(info, context_parallel=context_parallel, cp_group=mesh.get_group("cp"))


def group_options(backend: str, timeout: timedelta):
    """The options of a process group of ``backend`` ("gloo", "nccl") whose collectives wait ``timeout``."""
    options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    return options


def data_parallel(model: torch.nn.Module, info: Distributed, device: torch.device, *,
                  find_unused: bool) -> torch.nn.Module:
    """The module a training step calls: DDP's wrapper of ``model`` when several DDP workers share it,
    else ``model`` itself (one process, or FSDP, which shards the model in place)."""
    if not info.enabled or info.fsdp:
        return model
    # codebooks stay identical without broadcasting buffers: every worker applies the same
    # update from all-reduced statistics. torch 2.13 renamed the option (the old name warns on every worker).
    renamed = "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    return torch.nn.parallel.DistributedDataParallel(
        model, **{"forward_sync_buffers" if renamed else "broadcast_buffers": False},
        find_unused_parameters=find_unused, device_ids=[device.index] if device.type == "cuda" else None,
    )


def teardown_distributed(info: Distributed) -> None:
    """Destroy the process groups; the caller has dropped its :func:`data_parallel` wrapper first.

    Why the order matters (a hang seen in CI, then reproduced here with its C stacks): a gloo process group joins
    its worker threads when it is destroyed, and a worker may still be releasing a finished collective whose tensors
    were made in Python, which takes the GIL. The group's Python object releases the GIL before it destroys the
    group; DDP's C++ reducer, which holds the group too, does not. Whichever lets go last destroys it: if that is the
    reducer (freed after ``destroy_process_group``), the main thread joins the worker while holding the GIL the
    worker waits for, and the process never exits. So the wrapper goes first (collected here with any reference
    cycle it sits in) and the group's Python objects, released by ``destroy_process_group``, go last."""
    if (info.enabled or info.fsdp) and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
