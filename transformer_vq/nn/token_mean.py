"""The mean of a per-token loss over the real tokens: what the language models' cross-entropy and the quantizer's
commitment loss share."""

from __future__ import annotations

import torch


def token_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scalar: the mean of ``values`` over the positions where ``mask`` (same shape, bool) is True; ``None``: over all.

    Without a mask this is a plain mean rather than a sum weighted by a tensor of ones divided by the ones' sum (the
    same number): compiled by torch 2.11's inductor for CUDA, that sum of a constant made a Triton kernel which
    Triton 3.6 could not compile ("operand #1 does not dominate this use"; seen on an H100 with a compiled unit).
    Triton 3.9, the ``triton`` extra's pin, compiles that kernel (both compiled for sm_90 on a CPU, 2026-11-27).
    """
    if mask is None:
        return values.mean()
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)
