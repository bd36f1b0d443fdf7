"""Models built from the registry of architectures (:mod:`transformer_vq.config.arch`): the one place where a model
class the registry names by its import path is imported, above the models in the import graph (the torch-free
registry itself never imports them)."""

from __future__ import annotations

import importlib

import torch

from transformer_vq.config.arch import Arch


def model_class(arch: Arch) -> type[torch.nn.Module]:
    """The model class of ``arch``."""
    module, _, name = arch.model.partition(":")
    return getattr(importlib.import_module(module), name)


def instantiate(arch: Arch, model_cfg) -> torch.nn.Module:
    """A new model of ``arch`` built from its model config ``model_cfg`` (an instance of ``arch.config``)."""
    if not isinstance(model_cfg, arch.config):
        raise TypeError(f"{arch.title} is built from a {arch.config.__name__}, got {type(model_cfg).__name__}")
    return model_class(arch)(model_cfg)
