"""The damped EMA as Mega defines it, one step per token: the oracle the FFT convolution is tested against.

Per channel ``d`` and EMA dimension ``j`` (coefficients of :class:`~transformer_vq.ops.ema.EMACoefficients`):

    h_t[j] = alpha_j beta_j x_t + (1 - alpha_j delta_j) h_{t-1}[j]          (h_{-1}: the initial state, or 0)
    y_t    = sum_j eta_j h_t[j]

One token is one step, so the same loop is also the decoding form: ``O(D N)`` work and memory per token, whatever
the number of tokens before it.

Letters: B batch, T positions, D channels, N the EMA dimension.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.ema.coefficients import EMACoefficients, check_inputs


def ema_naive(x: torch.Tensor, coef: EMACoefficients, /, *,
              initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal EMA of ``x [B, T, D]`` started from ``initial_state [B, D, N]`` (``None``: zeros), token by token.

    Returns ``(y [B, T, D], final_state [B, D, N])``: the state after the last token, to start the next piece from.
    """
    check_inputs(x, coef, initial_state=initial_state)
    B, T, D = x.shape
    h = x.new_zeros(B, D, coef.decay.shape[-1]) if initial_state is None else initial_state
    outputs = []
    for t in range(T):
        h = coef.decay * h + coef.weight_in * x[:, t, :, None]  # (B, D, N)
        outputs.append((h * coef.weight_out).sum(-1))  # (B, D)
    return torch.stack(outputs, dim=1), h  # (B, T, D)


def ema_bidir_naive(x: torch.Tensor, forward: EMACoefficients, backward: EMACoefficients, /) -> torch.Tensor:
    """``y [B, T, D]``: the causal EMA of ``x [B, T, D]`` plus a second, independent one run from the last token back
    to the first (each from a zero state; the backward one reads token ``t`` too)."""
    check_inputs(x, forward, backward)
    later, _ = ema_naive(x.flip(1), backward)
    return ema_naive(x, forward)[0] + later.flip(1)


def circular_conv_dense(x: torch.Tensor, kernel: torch.Tensor, n: int) -> torch.Tensor:
    """``y_t = sum_s kernel[:, (t - s) mod n] x_s`` for ``x [B, T, D]`` and ``kernel [D, K]`` (``K <= n``, zero beyond),
    as one dense ``[D, T, T]`` matrix: the twin of :class:`~transformer_vq.ops.ema.conv.FFTConvolution`."""
    T = x.shape[1]
    lag = (torch.arange(T)[:, None] - torch.arange(T)[None, :]) % n  # (t, s)
    matrix = torch.nn.functional.pad(kernel, (0, n - kernel.shape[1]))[:, lag]  # (D, T, T)
    return torch.einsum("dts,bsd->btd", matrix, x)
