"""How evaluation and sampling run a model: in eval mode (dropout off, codebooks frozen) without
building an autograd graph, then back in the mode it was in, so a training that evaluates midway
goes on training exactly as before."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Switch ``model`` to eval mode under ``torch.no_grad`` for the block; restore its training mode after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)
