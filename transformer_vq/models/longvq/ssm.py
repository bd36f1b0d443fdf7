"""The state space layer of LongVQ (its eq. 9, ``Z = SiLU(SSM(X))``): Mega's multi-dimensional damped EMA.

Which SSM. LongVQ names "SSM" without defining it, but its language-model hyperparameters (Table 8) list an "EMA
dimension (h) = 16" next to Mega's other names (shared representation ``z``, value ``v``): the layer it builds on is
Mega's multi-dimensional damped exponential moving average (Ma et al. 2022), a diagonal SSM that is already
discrete (``A_bar = diag(1 - alpha delta)``, ``B_bar = alpha beta``, ``C = eta``, ``D = omega``). It is also exact in
real arithmetic, so the convolution and the recurrence agree to rounding (S4D would need complex
parameters and a ZOH step). docs/longvq.md ("The state space layer") records the choice.

Per channel ``d`` and EMA dimension ``j``, with ``alpha, delta`` in ``(0, 1)`` (sigmoids of free parameters):

    h_t[j] = alpha_j beta_j x_t + (1 - alpha_j delta_j) h_{t-1}[j]          (expansion by beta, damped EMA)
    y_t    = sum_j eta_j h_t[j] + omega x_t                                  (projection, skip term D of eq. 2)

An encoder adds a second, independent EMA read backwards (as Mega and S4 do for bidirectional tasks). The math (the
recurrence, the FFT convolution it unrolls to, the backward read) is the pure functions of
:mod:`transformer_vq.ops.ema`; this module holds the parameters, turns them into the coefficients those functions
take, adds the skip term and carries the state.

Letters: B batch, T positions, D channels, N the EMA dimension ``h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from transformer_vq.ops.ema import EMACoefficients, ema_bidir_conv, ema_bidir_naive, ema_conv, ema_naive


@dataclass
class EMAState:
    """What a causal SSM carries between calls: the EMA of every channel and dimension (size independent of T)."""

    h: torch.Tensor
    """``[B, D, N]`` the hidden state after the last consumed token."""

    def detach(self) -> "EMAState":
        """A copy cut from the autograd graph."""
        return EMAState(self.h.detach())

    def nbytes(self) -> int:
        """Bytes held by the state."""
        return self.h.numel() * self.h.element_size()


class DampedEMA(nn.Module):
    """Mega's multi-dimensional damped EMA with the skip term: ``SSM(X)`` of LongVQ's eq. 9.

    Args:
        dim: channels ``D`` (each filtered independently).
        ema_dim: EMA dimension ``N`` (Table 8's ``h``).
        bidirectional: add a backward EMA with parameters of its own (an encoder); it carries no state.
        timescale: 0 for Mega's initialization; ``T >= 2`` to start ``alpha`` at ``1 / tau``, ``tau`` log-uniform
            over ``[1.5, T]`` (:meth:`reset_parameters`).
    """

    def __init__(self, dim: int, ema_dim: int, *, bidirectional: bool, timescale: float = 0.0):
        super().__init__()
        self.dim, self.ema_dim, self.bidirectional, self.timescale = dim, ema_dim, bidirectional, timescale
        directions = 2 if bidirectional else 1
        self.alpha = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.delta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.beta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.eta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.omega = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Mega's initialization: ``alpha, delta`` logits and ``eta``, ``omega`` normal; ``beta`` near alternating
        signs, so the EMA dimensions of a channel start as different filters.

        With a ``timescale`` T, ``alpha`` starts at ``1 / tau`` instead, ``tau`` log-uniform over ``[1.5, T]``: the
        decay ``1 - alpha delta`` (``delta`` near 1/2) then remembers from about 3 to about ``2T`` tokens. Why: at
        Mega's decays near 0.75 a token's influence is 1e-4 of its own 32 tokens later, so a sequence model of
        32 x 32 images in raster order does not see the row above, and the gradient that could lengthen the memory
        is as small (Pathfinder stayed at chance, benchmarks/results/classify-curve-pathfinder-2026-11-27.md); LongVQ's
        attention cannot make up for it, its far keys being quantized and position-free. Linear recurrent models
        learn Pathfinder only from decays near 1 (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for
        Long Sequences"); S4D's log-spaced steps do the same."""
        if self.timescale:
            tau = torch.empty_like(self.alpha).uniform_(math.log(1.5), math.log(self.timescale)).exp_()
            with torch.no_grad():
                self.alpha.copy_(-torch.log(tau - 1))  # logit(1 / tau)
        else:
            nn.init.normal_(self.alpha, std=0.2)
        nn.init.normal_(self.delta, std=0.2)
        signs = torch.ones(self.ema_dim)
        signs[1::2] = -1.0
        with torch.no_grad():
            self.beta.copy_(signs + 0.02 * torch.randn_like(self.beta))
        nn.init.normal_(self.eta, std=1.0)
        nn.init.normal_(self.omega, std=1.0)

    def coefficients(self, direction: int = 0, dtype: torch.dtype | None = None) -> EMACoefficients:
        """The discrete SSM of one direction (0 forward, 1 backward), computed in ``dtype`` (default: the
        parameters'). From bfloat16 parameters in bfloat16, a decay ``1 - alpha delta`` could be no nearer 1 than
        2^-8, a memory of a few hundred tokens at most: the forward pass asks for float32."""
        alpha, delta, beta, eta = (p[direction].to(dtype) for p in (self.alpha, self.delta, self.beta, self.eta))
        alpha, delta = torch.sigmoid(alpha), torch.sigmoid(delta)
        return EMACoefficients(weight_in=alpha * beta, decay=1 - alpha * delta, weight_out=eta * self.ema_dim ** -0.5)

    def forward(self, x: torch.Tensor, state: EMAState | None = None, *,
                naive: bool = False) -> tuple[torch.Tensor, EMAState | None]:
        """``(SSM(x) [B, T, D], state)``; a causal call continues ``state`` (``None``: the start of the sequences).

        A causal call of one token takes the recurrence (decoding); longer calls the FFT convolution. ``naive``
        takes the recurrence at every length instead (tests and the dense reference of the model). The SSM runs in
        float32 at least, outside autocast: the powers ``q^t`` of a long sequence and the carried state need the
        precision.
        """
        if self.bidirectional and state is not None:
            raise ValueError("a bidirectional SSM reads whole sequences and carries no state: pass state=None")
        with torch.autocast(x.device.type, enabled=False):
            y, h_last = self._filter(x.to(torch.promote_types(x.dtype, torch.float32)), state, naive)
        return y.to(x.dtype), None if h_last is None else EMAState(h_last)

    def _filter(self, x: torch.Tensor, state: EMAState | None, naive: bool):
        """``(y, h_last)`` of :meth:`forward` in ``x``'s dtype, whatever the parameters' (``h_last`` None when
        bidirectional)."""
        omega = self.omega.to(x.dtype)
        if self.bidirectional:
            form = ema_bidir_naive if naive else ema_bidir_conv
            return form(x, self.coefficients(0, x.dtype), self.coefficients(1, x.dtype)) + omega * x, None
        # one token is one step of the recurrence (decoding); longer calls take the convolution
        form = ema_naive if naive or x.shape[1] == 1 else ema_conv
        y, h_last = form(x, self.coefficients(0, x.dtype), initial_state=None if state is None else state.h)
        return y + omega * x, h_last

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, ema_dim={self.ema_dim}, bidirectional={self.bidirectional}, "
                f"timescale={self.timescale}")
