"""Saving the operator state carried between training windows, without pickling objects.

A run stopped in the middle of a batch (a signal, or a checkpoint step that is not a multiple of
``seq_len / update_len``) must resume with the exact state the next window would have received.
That state is a tree of dataclasses (e.g. one ``VQAttentionState`` per attention layer), lists,
tuples and dicts whose leaves are tensors and numbers. :func:`to_plain` turns it into dicts, lists,
tensors and numbers, which ``torch.save`` writes and ``torch.load(weights_only=True)`` reads back;
:func:`from_plain` rebuilds it, instantiating only dataclasses defined inside ``transformer_vq``.
"""

from __future__ import annotations

import dataclasses
import importlib

import torch

_TYPE = "__dataclass__"
_TUPLE = "__tuple__"


def to_plain(obj):
    """A representation of ``obj`` made of dicts, lists, CPU tensors and numbers only.

    GPU tensors are copied to the CPU: the plain form is gathered from every worker to rank 0 and written into a
    checkpoint, and a pickled CUDA tensor would be rebuilt on the GPU of the worker that sent it.
    """
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        fields = {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {_TYPE: f"{cls.__module__}:{cls.__qualname__}", **fields}
    if isinstance(obj, tuple):
        return {_TUPLE: [to_plain(x) for x in obj]}
    if isinstance(obj, list):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    raise TypeError(f"cannot save a carried state containing {type(obj).__name__}")


def from_plain(plain, device: torch.device | str = "cpu"):
    """Inverse of :func:`to_plain`, moving tensors to ``device``."""
    if isinstance(plain, torch.Tensor):
        return plain.to(device)
    if isinstance(plain, list):
        return [from_plain(x, device) for x in plain]
    if isinstance(plain, dict):
        if _TUPLE in plain:
            return tuple(from_plain(x, device) for x in plain[_TUPLE])
        if _TYPE in plain:
            cls = _dataclass_type(plain[_TYPE])
            return cls(**{k: from_plain(v, device) for k, v in plain.items() if k != _TYPE})
        return {k: from_plain(v, device) for k, v in plain.items()}
    return plain


def plain_rows(plain) -> int | None:
    """The batch rows of a state in its plain form (:func:`to_plain`): the first dimension of its first tensor
    (``None`` without one)."""
    if isinstance(plain, torch.Tensor):
        return plain.shape[0] if plain.dim() else None
    values = plain.values() if isinstance(plain, dict) else plain if isinstance(plain, list) else ()
    for value in values:
        rows = plain_rows(value)
        if rows is not None:
            return rows
    return None


def all_finite(obj) -> bool:
    """Whether every floating tensor in ``obj`` (a carried state: a tree of dataclasses, lists, tuples and dicts) is
    finite."""
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return all(all_finite(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, (list, tuple)):
        return all(all_finite(x) for x in obj)
    if isinstance(obj, dict):
        return all(all_finite(x) for x in obj.values())
    return True


def _dataclass_type(name: str) -> type:
    module_name, _, qualname = name.partition(":")
    if not (module_name == "transformer_vq" or module_name.startswith("transformer_vq.")):
        raise ValueError(f"refusing to rebuild carried state of type {name}: not a transformer_vq dataclass")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"refusing to rebuild carried state of type {name}: not a dataclass")
    return obj
