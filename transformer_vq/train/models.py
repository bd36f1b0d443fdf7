"""Models built from the registry of architectures (:mod:`transformer_vq.config.arch`): the one place where a model
class the registry names by its import path is imported, above the models in the import graph (the torch-free
registry itself never imports them)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import torch

from transformer_vq.config.arch import Arch
from transformer_vq.config.fields import ConfigError
from transformer_vq.hostmem import meminfo_bytes


def model_class(arch: Arch) -> type[torch.nn.Module]:
    """The model class of ``arch``."""
    module, _, name = arch.model.partition(":")
    return getattr(importlib.import_module(module), name)


def instantiate(arch: Arch, model_cfg) -> torch.nn.Module:
    """A new model of ``arch`` built from its model config ``model_cfg`` (an instance of ``arch.config``), once
    :func:`check_fits` has found room for it."""
    if not isinstance(model_cfg, arch.config):
        raise TypeError(f"{arch.title} is built from a {arch.config.__name__}, got {type(model_cfg).__name__}")
    check_fits(arch, model_cfg)
    return model_class(arch)(model_cfg)


def on_meta(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model ``make`` builds, on the meta device: shapes only, nothing allocated, no random number drawn."""
    with torch.device("meta"):
        return make()


def model_bytes(arch: Arch, model_cfg) -> tuple[int, str, tuple[int, ...]]:
    """``(bytes, name, shape)``: what the parameters and buffers of a model of ``model_cfg`` take, counted on the
    meta device, and the name and shape of its largest tensor."""
    model = on_meta(lambda: model_class(arch)(model_cfg))
    tensors = [*model.named_parameters(), *model.named_buffers()]
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    name, largest = max(tensors, key=lambda item: item[1].numel())
    return total, name, tuple(largest.shape)


def check_fits(arch: Arch, model_cfg, available: int | None = None) -> None:
    """Refuse a model whose weights and buffers alone exceed the memory ``available`` (default: the machine's
    available memory, when known), naming the config field that sizes its largest tensor; an allocation would
    otherwise fail with an out-of-memory error that names no field, or take the machine down."""
    available = meminfo_bytes("MemAvailable") if available is None else available
    if available is None:
        return
    total, name, shape = model_bytes(arch, model_cfg)
    if total <= available:
        return
    sizes = [(value, f.name) for f in dataclasses.fields(model_cfg)
             if type(value := getattr(model_cfg, f.name)) is int and value > 1 and value in shape]
    value, field = max(sizes) if sizes else (None, None)
    text = (f"makes a model of {total / 2**30:,.1f} GiB of weights and buffers ({name} alone is "
            f"{' x '.join(map(str, shape))}), more than the {available / 2**30:,.1f} GiB of memory available; "
            f"lower it (or another size of the model)")
    if field is None:
        raise ConfigError(f"the model {text}")
    raise ConfigError(f"{field}={value} {text}", [(field, f"{value} {text}")], type(model_cfg))
