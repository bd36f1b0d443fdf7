"""Sinusoid tables (App. C: maximum wavelength 1e5 everywhere) for relative and absolute positions."""

from __future__ import annotations

import torch


def sinusoids(positions: torch.Tensor, dim: int, max_wavelength: float = 1e5,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[sin(p w_j) for j < dim/2 | cos(p w_j) for j < dim/2]`` with ``w_j = max_wavelength^(-2j/dim)``.

    Args:
        positions: ``[...]`` positions (any real values).
        dim: even table width.
        dtype: the table's dtype. The angles are computed in it, but never in less than float32: a float64
            model gets a float64-exact table (a float32 one cast up would be off by ~1e-8 relative), and a
            half-precision model a float32 table rounded once at the end (its angles reach ``2L`` radians).
    Returns:
        ``[..., dim]`` table of ``dtype``.
    """
    work = torch.promote_types(dtype, torch.float32)
    half = dim // 2
    freqs = max_wavelength ** (-torch.arange(half, dtype=work, device=positions.device) * 2 / dim)
    angles = positions.to(work).unsqueeze(-1) * freqs  # (..., dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)
