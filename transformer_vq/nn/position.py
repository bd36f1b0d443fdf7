"""Sinusoid tables (App. C: maximum wavelength 1e5 everywhere) for relative and absolute positions."""

from __future__ import annotations

import torch


def sinusoids(positions: torch.Tensor, dim: int, max_wavelength: float = 1e5) -> torch.Tensor:
    """``[sin(p w_j) for j < dim/2 | cos(p w_j) for j < dim/2]`` with ``w_j = max_wavelength^(-2j/dim)``.

    Args:
        positions: ``[...]`` positions (any real values).
        dim: even table width.
    Returns:
        ``[..., dim]`` float32 table.
    """
    half = dim // 2
    freqs = max_wavelength ** (-torch.arange(half, dtype=torch.float32, device=positions.device) * 2 / dim)
    angles = positions.float().unsqueeze(-1) * freqs  # (..., dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
