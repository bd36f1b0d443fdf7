"""The device a job runs on, and the process set up for a training run on it."""

from __future__ import annotations

import dataclasses

import torch

from transformer_vq.hostmem import retain_freed_memory


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available; use --device cpu (or auto)")
    return torch.device(name)


def runnable_on(run_cfg, device: torch.device):
    """``run_cfg`` (a run's config with a ``model`` section) with ``attn_backend`` 'eager' where its 'triton' cannot
    run on ``device`` here, else unchanged: the backend is how training computed attention, not what the weights
    mean, so a run trained on a GPU is read on a CPU with the same attention."""
    from transformer_vq.ops.vq.attention import triton_problem

    if getattr(run_cfg.model, "attn_backend", "eager") != "triton" or triton_problem(device) is None:
        return run_cfg
    return dataclasses.replace(run_cfg, model=run_cfg.model.replace(attn_backend="eager"))


def use_threads(threads: int) -> None:
    """PyTorch's CPU threads for this process: ``threads``, or PyTorch's default (one per core) for 0."""
    if threads:
        torch.set_num_threads(threads)


def training_device(cfg) -> torch.device:
    """Set up this process for a training run of ``cfg`` (a task's training config) and return its device:
    PyTorch's CPU threads (``threads``), the device, and on a CPU the host memory kept for reuse
    (``retain_host_memory``; :mod:`transformer_vq.hostmem`)."""
    use_threads(cfg.threads)
    device = resolve_device(cfg.device)
    if device.type == "cpu" and cfg.retain_host_memory:
        retain_freed_memory()
    return device
