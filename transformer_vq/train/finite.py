"""Finding NaN and infinity in trees of tensors: shared by checkpointing (never save what cannot be resumed) and the
training step (stop at the first step that breaks the weights), on one process or, through the sharded variant in
``parallel/fsdp.py``, across workers."""

from __future__ import annotations

import torch


def named_tensors(tree, prefix: str):
    """(name, tensor) for every tensor in a tree of dicts and lists."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from named_tensors(value, f"{prefix}.{i}")


def nonfinite_names(named_tensors) -> list[str]:
    """Names of the floating-point tensors of ``named_tensors`` that hold a NaN or an infinity."""
    named = [(name, t) for name, t in named_tensors if t.is_floating_point() and t.numel()]
    if not named:
        return []
    # one stack and one read per device: a model's tensors sit on its GPU while an optimizer keeps some (Adam's
    # step counts) on the CPU, and a stack takes one device
    flags = {}
    for device in dict.fromkeys(t.device for _, t in named):
        here = [i for i, (_, t) in enumerate(named) if t.device == device]
        flags.update(zip(here, torch.stack([torch.isfinite(named[i][1]).all() for i in here]).tolist()))
    return [name for i, (name, _) in enumerate(named) if not flags[i]]
