"""The state space layer of LongVQ (its eq. 9, ``Z = SiLU(SSM(X))``): Mega's multi-dimensional damped EMA.

Which SSM. LongVQ names "SSM" without defining it, but its language-model hyperparameters (Table 8) list an "EMA
dimension (h) = 16" next to Mega's other names (shared representation ``z``, value ``v``): the layer it builds on is
Mega's multi-dimensional damped exponential moving average (Ma et al. 2022), a diagonal SSM that is already
discrete (``A_bar = diag(1 - alpha delta)``, ``B_bar = alpha beta``, ``C = eta``, ``D = omega``). It is also exact in
real arithmetic, so the convolution, the recurrence and the naive sum agree to rounding (S4D would need complex
parameters and a ZOH step). docs/longvq.md ("The state space layer") records the choice.

Per channel ``d`` and EMA dimension ``j``, with ``alpha, delta`` in ``(0, 1)`` (sigmoids of free parameters):

    h_t[j] = alpha_j beta_j x_t + (1 - alpha_j delta_j) h_{t-1}[j]          (expansion by beta, damped EMA)
    y_t    = sum_j eta_j h_t[j] + omega x_t                                  (projection, skip term D of eq. 2)

Unrolled, ``y = K * x + omega x`` with the causal kernel ``K[t] = sum_j eta_j alpha_j beta_j q_j^t``,
``q_j = 1 - alpha_j delta_j``; a piece started from the state ``h_{-1}`` adds ``sum_j eta_j q_j^{t+1} h_{-1}[j]``.
An encoder adds a second, independent EMA read backwards (as Mega and S4 do for bidirectional tasks):
``y_t = sum_{s<=t} K_f[t-s] x_s + sum_{s>=t} K_b[s-t] x_s + omega x_t``.

Three forms of the same map: :func:`ema_conv` (FFT convolution, whole sequences or pieces with a carried state),
:func:`ema_recurrence` (one step per token, the decoding form) and :func:`ema_naive` / :func:`ema_bidir_naive` (the
double sum of the definition, the oracle).

Letters: B batch, T positions, D channels, N the EMA dimension ``h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn


class EMACoefficients(NamedTuple):
    """The discrete diagonal SSM of one direction, each ``[D, N]``."""

    weight_in: torch.Tensor
    """``alpha beta``: what one input adds to each EMA dimension (``B_bar``)."""
    decay: torch.Tensor
    """``q = 1 - alpha delta`` in ``(0, 1)``: the damping of each EMA dimension per step (``A_bar``)."""
    weight_out: torch.Tensor
    """``eta / sqrt(N)``: the projection of the EMA dimensions back to the channel (``C``)."""


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


def causal_fft_conv(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``[B, T, D]``: ``y_t = sum_{s<=t} kernel[:, t - s] x_s`` by FFT (zero-padded to ``2T``: no wrap-around)."""
    length = x.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)  # the FFT runs in float32 at least (bfloat16 has none)
    x_f = torch.fft.rfft(x.transpose(1, 2).to(dtype), n=2 * length)  # (B, D, T + 1)
    k_f = torch.fft.rfft(kernel.to(dtype), n=2 * length)  # (D, T + 1)
    return torch.fft.irfft(x_f * k_f, n=2 * length)[..., :length].transpose(1, 2).to(x.dtype)  # (B, T, D)


def ema_conv(x: torch.Tensor, coef: EMACoefficients,
             h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal EMA of ``x [B, T, D]`` started from ``h [B, D, N]`` (``None``: zeros), by FFT convolution.

    Returns ``(y [B, T, D], h_last [B, D, N])``; ``y`` holds the EMA part only (no ``omega x``). The state's part of
    the output and the final state are sums over ``N`` and ``T``: linear in ``T``.
    """
    B, T, D = x.shape
    powers = decay_powers(coef.decay, T)  # shared by the kernel, the final state and the state's output
    y = causal_fft_conv(x, ema_kernel(coef, T, powers))
    C, n_chunks = powers.chunk, powers.coarse.shape[-1]
    # h_last[j] = q^T h[j] + sum_s alpha beta q^(T-1-s) x_s: with u = T-1-s = c C + r, a product over chunks
    reversed_x = torch.nn.functional.pad(x.flip(1), (0, 0, 0, n_chunks * C - T)).view(B, n_chunks, C, D)
    within = torch.einsum("bcrd,dnr->bdnc", reversed_x, powers.fine)  # sum_r q^r x_(T-1-cC-r)
    h_last = coef.weight_in * torch.einsum("bdnc,dnc->bdn", within, powers.coarse)
    if h is not None:
        # y_t += sum_j eta_j q_j^(t+1) h[j], with t = c C + r
        start = (h * coef.weight_out * coef.decay).unsqueeze(-1) * powers.coarse  # (B, D, N, n_chunks)
        from_state = torch.einsum("bdnc,dnr->bcrd", start, powers.fine).reshape(B, n_chunks * C, D)
        y = y + from_state[:, :T]
        h_last = h_last + coef.decay ** T * h
    return y, h_last


def ema_recurrence(x: torch.Tensor, coef: EMACoefficients,
                   h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map as :func:`ema_conv`, one step per token: ``O(D N)`` work and memory per token (decoding)."""
    B, T, D = x.shape
    if h is None:
        h = x.new_zeros(B, D, coef.decay.shape[-1])
    outputs = []
    for t in range(T):
        h = coef.decay * h + coef.weight_in * x[:, t, :, None]  # (B, D, N)
        outputs.append((h * coef.weight_out).sum(-1))
    return torch.stack(outputs, dim=1), h


def ema_naive(x: torch.Tensor, coef: EMACoefficients, h: torch.Tensor | None = None) -> torch.Tensor:
    """``y_t = sum_{s<=t} sum_j eta_j q_j^(t-s) alpha_j beta_j x_s + sum_j eta_j q_j^(t+1) h[j]``, term by term."""
    B, T, D = x.shape
    y = torch.zeros_like(x)
    for t in range(T):
        for s in range(t + 1):
            y[:, t] += (coef.weight_out * coef.decay ** (t - s) * coef.weight_in).sum(-1) * x[:, s]
        if h is not None:
            y[:, t] += (coef.weight_out * coef.decay ** (t + 1) * h).sum(-1)
    return y


def ema_bidir_conv(x: torch.Tensor, forward: EMACoefficients, backward: EMACoefficients) -> torch.Tensor:
    """``sum_{s<=t} K_f[t-s] x_s + sum_{s>=t} K_b[s-t] x_s`` of whole sequences ``x [B, T, D]`` by FFT."""
    T = x.shape[1]
    later = causal_fft_conv(x.flip(1), ema_kernel(backward, T)).flip(1)  # the causal EMA of the reversed sequence
    return causal_fft_conv(x, ema_kernel(forward, T)) + later


def ema_bidir_naive(x: torch.Tensor, forward: EMACoefficients, backward: EMACoefficients) -> torch.Tensor:
    """The definition of :func:`ema_bidir_conv`, term by term."""
    T = x.shape[1]
    y = ema_naive(x, forward)
    for t in range(T):
        for s in range(t, T):
            y[:, t] += (backward.weight_out * backward.decay ** (s - t) * backward.weight_in).sum(-1) * x[:, s]
    return y


class DampedEMA(nn.Module):
    """Mega's multi-dimensional damped EMA with the skip term: ``SSM(X)`` of LongVQ's eq. 9.

    Args:
        dim: channels ``D`` (each filtered independently).
        ema_dim: EMA dimension ``N`` (Table 8's ``h``).
        bidirectional: add a backward EMA with parameters of its own (an encoder); it carries no state.
    """

    def __init__(self, dim: int, ema_dim: int, *, bidirectional: bool):
        super().__init__()
        self.dim, self.ema_dim, self.bidirectional = dim, ema_dim, bidirectional
        directions = 2 if bidirectional else 1
        self.alpha = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.delta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.beta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.eta = nn.Parameter(torch.empty(directions, dim, ema_dim))
        self.omega = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Mega's initialization: ``alpha, delta`` logits and ``eta``, ``omega`` normal; ``beta`` near alternating
        signs, so the EMA dimensions of a channel start as different filters."""
        nn.init.normal_(self.alpha, std=0.2)
        nn.init.normal_(self.delta, std=0.2)
        signs = torch.ones(self.ema_dim)
        signs[1::2] = -1.0
        with torch.no_grad():
            self.beta.copy_(signs + 0.02 * torch.randn_like(self.beta))
        nn.init.normal_(self.eta, std=1.0)
        nn.init.normal_(self.omega, std=1.0)

    def coefficients(self, direction: int = 0) -> EMACoefficients:
        """The discrete SSM of one direction (0 forward, 1 backward)."""
        alpha, delta = torch.sigmoid(self.alpha[direction]), torch.sigmoid(self.delta[direction])
        return EMACoefficients(weight_in=alpha * self.beta[direction], decay=1 - alpha * delta,
                               weight_out=self.eta[direction] * self.ema_dim ** -0.5)

    def forward(self, x: torch.Tensor, state: EMAState | None = None, *,
                naive: bool = False) -> tuple[torch.Tensor, EMAState | None]:
        """``(SSM(x) [B, T, D], state)``; a causal call continues ``state`` (``None``: the start of the sequences).

        A causal call of one token takes the recurrence (decoding); longer calls the FFT convolution. ``naive``
        computes the definition instead (tests and the dense reference of the model). The SSM runs in float32 at
        least, outside autocast: the powers ``q^t`` of a long sequence and the carried state need the precision.
        """
        if self.bidirectional and state is not None:
            raise ValueError("a bidirectional SSM reads whole sequences and carries no state: pass state=None")
        with torch.autocast(x.device.type, enabled=False):
            y, h_last = self._filter(x.to(torch.promote_types(x.dtype, torch.float32)), state, naive)
        return y.to(x.dtype), None if h_last is None else EMAState(h_last)

    def _filter(self, x: torch.Tensor, state: EMAState | None, naive: bool):
        """``(y, h_last)`` of :meth:`forward` (``h_last`` None when bidirectional)."""
        if self.bidirectional:
            form = ema_bidir_naive if naive else ema_bidir_conv
            return form(x, self.coefficients(0), self.coefficients(1)) + self.omega * x, None
        coef = self.coefficients(0)
        h = None if state is None else state.h
        if naive:
            y, h_last = ema_naive(x, coef, h), ema_recurrence(x, coef, h)[1]
        elif x.shape[1] == 1:
            y, h_last = ema_recurrence(x, coef, h)
        else:
            y, h_last = ema_conv(x, coef, h)
        return y + self.omega * x, h_last

    def extra_repr(self) -> str:
        return f"dim={self.dim}, ema_dim={self.ema_dim}, bidirectional={self.bidirectional}"
