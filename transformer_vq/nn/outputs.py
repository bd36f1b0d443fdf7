"""What a module returns, as a dataclass that PyTorch's tree utilities can see into.

FSDP2 starts a sharded module's backward (gathering its parameters again) from hooks on the tensors of the module's
output. Before torch 2.13 it found those tensors with ``torch.utils._pytree.tree_flatten``, which treats an unregistered
dataclass as one opaque leaf: no hook, the parameters stay freed, and the backward fails on an empty storage (seen with
torch 2.11 on an H100). Registering each output dataclass as a pytree node makes every torch release find them.
"""

from __future__ import annotations

import dataclasses

from torch.utils import _pytree as pytree


def module_output(cls):
    """Register the dataclass ``cls`` as a pytree node (children: its fields, in order) and return it; use it as a
    decorator above ``@dataclass`` on every dataclass a module returns."""
    names = tuple(field.name for field in dataclasses.fields(cls))

    def flatten(output):
        return [getattr(output, name) for name in names], names

    def unflatten(values, context):
        return cls(**dict(zip(context, values)))

    def flatten_with_keys(output):  # tree_flatten_with_path and torch.export name each field by its attribute
        return [(pytree.GetAttrKey(name), getattr(output, name)) for name in names], names

    pytree.register_pytree_node(cls, flatten, unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
                                flatten_with_keys_fn=flatten_with_keys)
    return cls
