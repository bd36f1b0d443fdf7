"""Fully sharded data parallel training (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Each worker keeps ``1 / world_size`` of every parameter, of its gradient and of the optimizer state
(row slices of each tensor, as ``DTensor``). A unit's full parameters are all-gathered just before its
forward (and again for its backward) and freed after; its gradients are reduce-scattered (averaged)
as soon as they are computed. Sharding units are one per :class:`~transformer_vq.models.tvq.gau.GatedAttentionUnit`
(LongVQ: one per :class:`~transformer_vq.models.longvq.layer.LongVQBlock`), then the root (the embedding, the optional
head and gains), so at most one unit's full weights are live at a time besides the root's.

What stays replicated: the buffers, in particular the codebook EMA sums and counts. They are not
parameters, FSDP leaves them whole on every worker, and the training loop all-reduces their window
statistics exactly as under DDP (see docs/distributed.md).

Mixed precision (bfloat16): parameters are all-gathered in bfloat16 for the computation while the
sharded master copy, the gradient reduction and the optimizer stay float32. Forward inputs are not
cast: the residual stream and the carried attention state keep the dtype they have under DDP's
autocast.
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from transformer_vq.train.parallel.distributed import Distributed
from transformer_vq.train.finite import nonfinite_names


def mixed_precision(precision: str) -> MixedPrecisionPolicy | None:
    """The FSDP policy of a training precision: bfloat16 compute, float32 reduction (None for float32)."""
    if precision != "bfloat16":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)


def shard_model(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """Shard ``model`` in place over the default process group: one unit per attention unit, then
    the root. Build the optimizer afterwards (its parameters become the shards)."""
    # FSDP warns once per unit that outputs which are views would lose its backward hook under an
    # in-place op; the model never modifies a unit's output in place (the FSDP tests compare gradients)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
    policy = mixed_precision(precision)
    options = {"mp_policy": policy} if policy is not None else {}
    for unit in sharding_units(model):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


def sharding_units(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The modules sharded one by one: Transformer-VQ's attention units, or the blocks of a LongVQ model."""
    units = getattr(model, "units", None)
    return units if units is not None else model.backbone.blocks


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This worker's shard of a ``DTensor`` (a plain tensor is returned as it is)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def to_float(value: torch.Tensor) -> float:
    """A scalar that may be a replicated ``DTensor`` (e.g. the global gradient norm of sharded gradients)."""
    return (value.full_tensor() if isinstance(value, DTensor) else value).item()


def nonfinite_shards(named_tensors, dist_info: Distributed, device: torch.device) -> list[str]:
    """Names of the tensors holding NaN or infinity in any worker's shard, the same list on every
    worker (each worker sees only its own shard, so one collective makes them agree)."""
    bad = nonfinite_names((name, local_tensor(t)) for name, t in named_tensors)
    flag = torch.tensor([float(len(bad))], dtype=torch.float64, device=device)  # nccl reduces GPU tensors only
    dist_info.all_reduce_sum_([flag])
    if flag.item() == 0:
        return []
    return sorted({name for names in dist_info.all_gather_object(bad) for name in names})
