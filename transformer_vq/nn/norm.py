"""The normalization both model families share (Transformer-VQ's units, LongVQ's queries and keys)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS layer norm over the last dimension, without gain or bias."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)
