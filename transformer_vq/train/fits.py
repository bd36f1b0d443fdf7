"""Refuse, before it is built, a model whose training state cannot fit in this machine's memory.

:func:`~transformer_vq.train.models.check_fits` refuses a model whose weights alone do not fit; a training holds
three to four times as much. Without this check such a model is no error at all on Linux: memory is promised
lazily, the weights are allocated, and the kernel's OOM killer ends the process while the optimizer's first step
fills its state in, with no message (a ``--d-model 8192 --n-layers 200`` model, 5.7B parameters, 21 GiB of weights,
was killed that way on a 24 GiB machine). What the run certainly holds is known before any of it is allocated: the
weights, their gradients and the optimizer's state. Activations come on top and are not counted, so the check
refuses only what cannot possibly run.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from transformer_vq.config import ConfigError
from transformer_vq.hostmem import meminfo_bytes
from transformer_vq.train.models import on_meta

STATE_COPIES = {"adamw": 4, "adafactor": 2}
"""Copies of the weights' bytes a step holds: the weights, their gradients and AdamW's two moments (Adafactor's
factored moments are rows and columns: a small fraction, left out)."""
OPTIMIZER_NAMES = {"adamw": "AdamW", "adafactor": "Adafactor"}
GIB = 2**30


def state_bytes(build: Callable[[], torch.nn.Module], optimizer: str) -> tuple[int, int]:
    """``(parameters, bytes)`` of the training state of the model ``build`` makes: weights, gradients and optimizer
    state, plus the buffers (codebooks); counted on the meta device."""
    model = on_meta(build)
    params = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return params, weights * STATE_COPIES[optimizer] + buffers


def available_bytes(device: torch.device) -> int | None:
    """Memory this process may still fill: the GPU's free memory, or the host's available memory and free swap
    (``/proc/meminfo``); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    available = meminfo_bytes("MemAvailable")
    return None if available is None else available + (meminfo_bytes("SwapFree") or 0)


def check_fits(build: Callable[[], torch.nn.Module], optimizer: str, device: torch.device, world_size: int = 1,
               fsdp: bool = False, task: str = "lm") -> None:
    """Refuse (:class:`ConfigError`) a model whose weights, gradients and ``optimizer`` state exceed the memory
    ``device`` has free: on a GPU for this process, on the host for the workers that share it (torchrun's
    ``LOCAL_WORLD_SIZE``). Under FSDP (``fsdp``) each of the ``world_size`` workers holds a shard of the state.
    ``task`` ("lm" or "classify") picks the advice: a classifier's vocabulary is its dataset's, and it trains in one
    process."""
    if device.type not in ("cpu", "cuda"):
        return
    try:
        params, need = state_bytes(build, optimizer)
    except (RuntimeError, NotImplementedError):  # a model that cannot be built on the meta device goes unchecked
        return
    per_worker = need // world_size if fsdp else need
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    available = available_bytes(device)
    if available is None or per_worker * sharing <= available:
        return
    where = "the GPU has" if device.type == "cuda" else "this machine has"
    workers = f" on each of {sharing} workers" if sharing > 1 else ""
    shards = f" (a 1/{world_size} FSDP shard)" if fsdp and world_size > 1 else ""
    how = ("--d-model, --n-layers, --vocab-size) or shard it over more workers (torchrun with --parallel fsdp)"
           if task == "lm" else "--d-model, --n-layers)")
    state = f"{OPTIMIZER_NAMES[optimizer]}'s state"
    raise ConfigError(f"the model does not fit: its {params / 1e6:,.1f}M parameters with their gradients and {state} "
                      f"need {per_worker / GIB:,.1f} GiB{shards}{workers} before any activation, and {where} "
                      f"{available / GIB:,.1f} GiB available; make it smaller ({how}")
