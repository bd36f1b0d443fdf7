"""The damped EMA by FFT convolution: whole sequences, or pieces with a carried state, in ``O(T log T)``.

Unrolling the recurrence of :mod:`~transformer_vq.ops.ema.naive` gives ``y = K * x`` with the causal kernel

    K[t] = sum_j eta_j alpha_j beta_j q_j^t,        q_j = 1 - alpha_j delta_j

and a piece started from the state ``h_{-1}`` adds ``sum_j eta_j q_j^(t+1) h_{-1}[j]``; its final state is
``h_{T-1}[j] = q_j^T h_{-1}[j] + sum_s alpha_j beta_j q_j^(T-1-s) x_s``. The bidirectional form adds a second EMA
read backwards: ``y_t = sum_{s<=t} K_f[t-s] x_s + sum_{s>=t} K_b[s-t] x_s``.

Letters: B batch, T positions, D channels, N the EMA dimension, C the chunk of the factored powers.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from transformer_vq.ops.ema.coefficients import EMACoefficients, check_inputs


class DecayPowers(NamedTuple):
    """``q^t`` for ``t < n_chunks * chunk`` in two factors, ``q^(c chunk + r) = coarse[..., c] * fine[..., r]``.

    The table ``q^t`` itself is ``[D, N, T]``: building it (one ``exp`` per entry, many of them subnormal late in a
    long sequence) and reading it back dominated the LongVQ block's time. The two factors hold ``D N (T / C + C)``
    numbers (``C ~ sqrt(T)``), and every product with the table becomes a batched matmul over them.
    """

    coarse: torch.Tensor
    """``[D, N, n_chunks]``: ``q^(c chunk)``."""
    fine: torch.Tensor
    """``[D, N, chunk]``: ``q^r``."""

    @property
    def chunk(self) -> int:
        """The chunk length ``C``."""
        return self.fine.shape[-1]


def decay_powers(decay: torch.Tensor, length: int) -> DecayPowers:
    """The factors of ``decay ** t`` for ``0 <= t < length`` (rounded up to whole chunks of ``ceil(sqrt(length))``).

    Powers are ``exp(p log q)``: stable for any length (no repeated products).
    """
    chunk = max(1, math.isqrt(length - 1) + 1) if length > 1 else 1
    n_chunks = -(-length // chunk)
    log_q = decay.log().unsqueeze(-1)
    steps = torch.arange(max(chunk, n_chunks), device=decay.device, dtype=decay.dtype)
    return DecayPowers(coarse=torch.exp(steps[:n_chunks] * chunk * log_q), fine=torch.exp(steps[:chunk] * log_q))


def ema_kernel(coef: EMACoefficients, length: int, powers: DecayPowers | None = None) -> torch.Tensor:
    """``[D, T]``: the causal kernel ``K[t] = sum_j eta_j alpha_j beta_j q_j^t`` (``powers``: those of
    :func:`decay_powers` for ``length``, when the caller already has them)."""
    powers = decay_powers(coef.decay, length) if powers is None else powers
    scaled = (coef.weight_out * coef.weight_in).unsqueeze(-1) * powers.coarse  # (D, N, n_chunks)
    kernel = torch.bmm(scaled.transpose(1, 2), powers.fine)  # (D, n_chunks, chunk): K[c chunk + r]
    return kernel.flatten(1)[:, :length]


def fft_size(length: int) -> int:
    """The least ``n >= length`` with no prime factor above 5: the sizes an FFT transforms fastest (a power of two
    blindly can be nearly twice ``length``)."""
    n = max(1, length)
    while True:
        rest = n
        for prime in (2, 3, 5):
            while rest % prime == 0:
                rest //= prime
        if rest == 1:
            return n
        n += 1


def conv_size(length: int) -> int:
    """The circular convolution's size for ``length`` positions: lags ``-(T-1) .. T-1`` must not wrap onto each
    other, so at least ``2T - 1``."""
    return fft_size(2 * length - 1)


def fft_conv(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``[B, T, D]``: ``y_t = sum_s kernel[:, (t - s) mod n] x_s``, a circular convolution over ``n = conv_size(T)``
    positions by FFT (:class:`FFTConvolution`). A causal kernel ``[D, T]`` (zero-padded to ``n``) never wraps around:
    ``y_t = sum_{s<=t} kernel[:, t - s] x_s``; a two-sided kernel ``[D, n]`` holds lag ``-m`` at ``n - m``."""
    dtype = torch.promote_types(x.dtype, torch.float32)  # the FFT runs in float32 at least (bfloat16 has none)
    return FFTConvolution.apply(x.to(dtype), kernel.to(dtype), conv_size(x.shape[1])).to(x.dtype)


class FFTConvolution(torch.autograd.Function):
    """``y = irfft(rfft(x) rfft(kernel))[:T]`` over ``n`` positions, whose backward recomputes the two spectra
    instead of keeping them: autograd kept the spectra of ``x`` and of the kernel, the zero-padded ``x`` and the
    kernel (four ``[n, D]`` tensors at the peak of the backward); this keeps ``x`` and the kernel.

    With ``G = rfft(grad)``: ``d x = irfft(G conj(K))[:T]`` (the convolution's transpose is the correlation with the
    same kernel) and ``d kernel = irfft(sum_b G conj(X))[:K]`` (the correlation of the gradient with the input).
    Its twin, the same map as a dense ``[T, T]`` matrix, is :func:`~transformer_vq.ops.ema.naive.circular_conv_dense`.
    """

    @staticmethod
    def forward(x: torch.Tensor, kernel: torch.Tensor, n: int) -> torch.Tensor:
        spectrum = torch.fft.rfft(x, n=n, dim=1) * torch.fft.rfft(kernel, n=n).T  # (B, n // 2 + 1, D)
        return torch.fft.irfft(spectrum, n=n, dim=1)[:, :x.shape[1]]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, kernel, ctx.n = inputs
        ctx.save_for_backward(x, kernel)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, kernel = ctx.saved_tensors
        n, T = ctx.n, x.shape[1]
        g = torch.fft.rfft(grad, n=n, dim=1)  # (B, n // 2 + 1, D)
        grad_x = grad_kernel = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.fft.irfft(g * torch.fft.rfft(kernel, n=n).T.conj(), n=n, dim=1)[:, :T]
        if ctx.needs_input_grad[1]:
            cross = (g * torch.fft.rfft(x, n=n, dim=1).conj()).sum(dim=0)  # (n // 2 + 1, D)
            grad_kernel = torch.fft.irfft(cross.T, n=n)[:, :kernel.shape[1]]
        return grad_x, grad_kernel, None


def ema_conv(x: torch.Tensor, coef: EMACoefficients, /, *,
             initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal EMA of ``x [B, T, D]`` started from ``initial_state [B, D, N]`` (``None``: zeros), by FFT.

    Returns ``(y [B, T, D], final_state [B, D, N])``, as :func:`~transformer_vq.ops.ema.ema_naive` does. The state's
    part of the output and the final state are sums over ``N`` and ``T``: linear in ``T``.
    """
    check_inputs(x, coef, initial_state=initial_state)
    B, T, D = x.shape
    powers = decay_powers(coef.decay, T)  # shared by the kernel, the final state and the state's output
    y = fft_conv(x, ema_kernel(coef, T, powers))
    C, n_chunks = powers.chunk, powers.coarse.shape[-1]
    # h_last[j] = q^T h[j] + sum_s alpha beta q^(T-1-s) x_s: with u = T-1-s = c C + r, a product over chunks
    reversed_x = torch.nn.functional.pad(x.flip(1), (0, 0, 0, n_chunks * C - T)).view(B, n_chunks, C, D)
    within = torch.einsum("bcrd,dnr->bdnc", reversed_x, powers.fine)  # sum_r q^r x_(T-1-cC-r)
    h_last = coef.weight_in * torch.einsum("bdnc,dnc->bdn", within, powers.coarse)
    if initial_state is not None:
        # y_t += sum_j eta_j q_j^(t+1) h[j], with t = c C + r
        start = (initial_state * coef.weight_out * coef.decay).unsqueeze(-1) * powers.coarse  # (B, D, N, n_chunks)
        from_state = torch.einsum("bdnc,dnr->bcrd", start, powers.fine).reshape(B, n_chunks * C, D)
        y = y + from_state[:, :T]
        h_last = h_last + coef.decay ** T * initial_state
    return y, h_last


def ema_bidir_conv(x: torch.Tensor, forward: EMACoefficients, backward: EMACoefficients, /) -> torch.Tensor:
    """``y [B, T, D] = sum_{s<=t} K_f[t-s] x_s + sum_{s>=t} K_b[s-t] x_s`` of whole sequences ``x [B, T, D]``.

    Both directions are one convolution with the two-sided kernel ``k[m] = K_f[m]`` (lag ``m >= 0``) ``+ K_b[-m]``
    (lag ``m <= 0``): one FFT of ``x`` and one inverse instead of two each, and no reversed copies.
    """
    check_inputs(x, forward, backward)
    T = x.shape[1]
    k_f, k_b = ema_kernel(forward, T), ema_kernel(backward, T)  # (D, T) each
    # lags 0 .. T-1, then lags T .. n-T (out of reach: 0), then lags -(T-1) .. -1 at n - m
    gap = k_f.new_zeros(k_f.shape[0], conv_size(T) - 2 * T + 1)
    two_sided = torch.cat([k_f[:, :1] + k_b[:, :1], k_f[:, 1:], gap, k_b[:, 1:].flip(-1)], dim=-1)  # (D, n)
    return fft_conv(x, two_sided)
