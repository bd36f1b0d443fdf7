"""The input every form of the damped EMA takes besides the sequence: one direction's discrete diagonal SSM."""

from __future__ import annotations

from typing import NamedTuple

import torch


class EMACoefficients(NamedTuple):
    """The discrete diagonal SSM of one direction, each ``[D, N]`` (Mega's parameters after their sigmoids)."""

    weight_in: torch.Tensor
    """``alpha beta``: what one input adds to each EMA dimension (``B_bar``)."""
    decay: torch.Tensor
    """``q = 1 - alpha delta`` in ``(0, 1)``: the damping of each EMA dimension per step (``A_bar``)."""
    weight_out: torch.Tensor
    """``eta / sqrt(N)``: the projection of the EMA dimensions back to the channel (``C``)."""


def check_inputs(x: torch.Tensor, *coefs: EMACoefficients, initial_state: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` naming the first inconsistency among a sequence, its coefficients and its initial state."""
    if x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"x must be [B, T, D] with T >= 1, got shape {list(x.shape)}")
    batch, _, dim = x.shape
    for coef in coefs:
        for name, tensor in coef._asdict().items():
            if tensor.dim() != 2 or tensor.shape != coef.decay.shape or tensor.shape[0] != dim:
                raise ValueError(f"the coefficients must all be [D, N] with D={dim} the channels of x, got {name} "
                                 f"{list(tensor.shape)} and decay {list(coef.decay.shape)}")
    expected = [batch, dim, coefs[0].decay.shape[-1]]
    if initial_state is not None and list(initial_state.shape) != expected:
        raise ValueError(f"initial_state must be [B, D, N] = {expected}, got {list(initial_state.shape)}")
