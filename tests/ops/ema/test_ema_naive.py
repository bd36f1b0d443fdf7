"""The damped EMA's FFT convolution against the recurrence it unrolls (``ops/ema/naive.py``): outputs, final states
and every gradient in float64 at awkward lengths, pieces with the state carried equal to one call, the backward read
of an encoder, and the recurrence itself against the sum it unrolls to."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.ops.ema import EMACoefficients, ema_bidir_conv, ema_bidir_naive, ema_conv, ema_kernel, ema_naive
from transformer_vq.ops.ema.conv import FFTConvolution, conv_size, fft_size
from transformer_vq.ops.ema.naive import circular_conv_dense

# float64: the two forms are the same real-arithmetic map; only the summation order (and the FFT's rounding) differs.
TOL = dict(rtol=1e-10, atol=1e-10)

# (B, T, D, N): one token, a length that is no square (chunks of ceil(sqrt(T)) with a ragged last chunk), a long one
# where early inputs have decayed by many orders of magnitude, N = 1
GRID = [(2, 1, 3, 4), (1, 2, 2, 3), (2, 63, 3, 4), (1, 500, 2, 5), (2, 17, 4, 1)]


def grid_id(params):
    B, T, D, N = params
    return f"B{B}-T{T}-D{D}-N{N}"


def coefficients(D, N, seed=0, requires_grad=False):
    """Decays spread over ``(0, 1)`` (short and long memories both take part), signed input and output weights."""
    gen = torch.Generator().manual_seed(seed)
    alpha, delta = (torch.sigmoid(1.5 * torch.randn(D, N, generator=gen, dtype=torch.float64)) for _ in range(2))
    coef = EMACoefficients(weight_in=alpha * torch.randn(D, N, generator=gen, dtype=torch.float64),
                           decay=1 - alpha * delta,
                           weight_out=torch.randn(D, N, generator=gen, dtype=torch.float64) * N ** -0.5)
    return EMACoefficients(*(t.requires_grad_(requires_grad) for t in coef))


def sequence(B, T, D, seed=1, dtype=torch.float64):
    return torch.randn(B, T, D, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def state(B, D, N, seed=2):
    return torch.randn(B, D, N, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_state", [False, True], ids=["from-zero", "from-state"])
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_outputs_final_states_and_gradients_match_naive(params, with_state):
    B, T, D, N = params
    coef = coefficients(D, N, requires_grad=True)
    x = sequence(B, T, D).requires_grad_()
    h = state(B, D, N).requires_grad_() if with_state else None
    inputs = [x, *coef] + ([h] if with_state else [])
    y, h_last = ema_conv(x, coef, initial_state=h)
    y_ref, h_ref = ema_naive(x, coef, initial_state=h)
    assert y.shape == (B, T, D) and h_last.shape == (B, D, N)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(h_last, h_ref, **TOL)
    cotangents = (torch.randn_like(y), torch.randn_like(h_last))
    grads = torch.autograd.grad((y, h_last), inputs, cotangents)
    expected = torch.autograd.grad((y_ref, h_ref), inputs, cotangents)
    names = ["x", "weight_in", "decay", "weight_out", "initial_state"]
    for name, got, want in zip(names, grads, expected):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"gradient w.r.t. {name}: {m}")


@pytest.mark.parametrize("cuts", [[1], [5, 6, 40], [62], list(range(1, 63))],
                         ids=["1+62", "5+1+34+23", "62+1", "token-by-token"])
def test_pieces_with_the_carried_state_equal_one_call(cuts):
    B, T, D, N = 2, 63, 3, 4
    coef, x = coefficients(D, N), sequence(B, T, D)
    whole, whole_state = ema_conv(x, coef)
    for form in (ema_conv, ema_naive):
        h, pieces = None, []
        for a, b in zip([0, *cuts], [*cuts, T]):
            y, h = form(x[:, a:b], coef, initial_state=h)
            pieces.append(y)
        torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOL)
        torch.testing.assert_close(h, whole_state, **TOL)


@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_bidirectional_output_and_gradients_match_naive(params):
    B, T, D, N = params
    forward, backward = coefficients(D, N, requires_grad=True), coefficients(D, N, seed=3, requires_grad=True)
    x = sequence(B, T, D).requires_grad_()
    y, y_ref = ema_bidir_conv(x, forward, backward), ema_bidir_naive(x, forward, backward)
    torch.testing.assert_close(y, y_ref, **TOL)
    inputs = [x, *forward, *backward]
    cotangent = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, inputs, cotangent), torch.autograd.grad(y_ref, inputs, cotangent)):
        torch.testing.assert_close(got, want, **TOL)


def test_naive_is_the_sum_it_unrolls_to():
    """``y_t = sum_{s<=t} sum_j eta_j q_j^(t-s) alpha_j beta_j x_s + sum_j eta_j q_j^(t+1) h[j]``, term by term, and
    the backward read ``sum_{s>=t}`` of an encoder likewise."""
    B, T, D, N = 2, 7, 3, 4
    coef, backward, x, h = coefficients(D, N), coefficients(D, N, seed=3), sequence(B, T, D), state(B, D, N)
    causal, bidir = torch.zeros_like(x), torch.zeros_like(x)
    for t in range(T):
        causal[:, t] = (coef.weight_out * coef.decay ** (t + 1) * h).sum(-1)
        for s in range(T):
            term = (coef.weight_out * coef.decay ** abs(t - s) * coef.weight_in).sum(-1) * x[:, s]
            later = (backward.weight_out * backward.decay ** abs(t - s) * backward.weight_in).sum(-1) * x[:, s]
            causal[:, t] += term if s <= t else 0
            bidir[:, t] += (term if s <= t else 0) + (later if s >= t else 0)
    torch.testing.assert_close(ema_naive(x, coef, initial_state=h)[0], causal, **TOL)
    torch.testing.assert_close(ema_bidir_naive(x, coef, backward), bidir, **TOL)


def test_kernel_is_the_impulse_response():
    coef = coefficients(3, 4)
    impulse = torch.zeros(1, 9, 3, dtype=torch.float64)
    impulse[0, 0] = 1.0
    torch.testing.assert_close(ema_kernel(coef, 9).t(), ema_naive(impulse, coef)[0][0], **TOL)


def test_long_sequence_stays_accurate_in_float32():
    coef = EMACoefficients(*(t.float() for t in coefficients(3, 4)))
    x = sequence(2, 2000, 3, dtype=torch.float32)
    # float32 carries ~7 digits; the FFT's rounding grows with log T and the recurrence's with the memory length
    torch.testing.assert_close(ema_conv(x, coef)[0], ema_naive(x, coef)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", [ema_conv, ema_naive])
@pytest.mark.parametrize("change, message", [
    (lambda x, c, h: (x[0], c, h), "x must be [B, T, D] with T >= 1, got shape [5, 3]"),
    (lambda x, c, h: (x[:, :0], c, h), "x must be [B, T, D] with T >= 1, got shape [2, 0, 3]"),
    (lambda x, c, h: (x[..., :2], c, h),
     "the coefficients must all be [D, N] with D=2 the channels of x, got weight_in [3, 4] and decay [3, 4]"),
    (lambda x, c, h: (x, c._replace(weight_out=c.weight_out[:, :3]), h),
     "the coefficients must all be [D, N] with D=3 the channels of x, got weight_out [3, 3] and decay [3, 4]"),
    (lambda x, c, h: (x, c, h[:1]), "initial_state must be [B, D, N] = [2, 3, 4], got [1, 3, 4]"),
], ids=["x-2d", "x-empty", "x-channels", "coef-shapes", "state-batch"])
def test_bad_input_messages(form, change, message):
    x, coef, h = change(sequence(2, 5, 3), coefficients(3, 4), state(2, 3, 4))
    with pytest.raises(ValueError) as info:
        form(x, coef, initial_state=h)
    assert str(info.value) == message


@pytest.mark.parametrize("two_sided", [False, True], ids=["causal", "two-sided"])
@pytest.mark.parametrize("length", [1, 2, 7, 12, 33])
def test_fft_convolution_equals_its_dense_twin(length, two_sided):
    """The FFT convolution with its own backward (spectra recomputed) against the dense matrix of the same map:
    outputs and the gradients of the input and of the kernel, float64 to 1e-12, at 5-smooth and other sizes."""
    B, D = 2, 3
    n = conv_size(length)
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(B, length, D, dtype=torch.float64, generator=gen, requires_grad=True)
    kernel = torch.randn(D, n if two_sided else length, dtype=torch.float64, generator=gen, requires_grad=True)
    y, want = FFTConvolution.apply(x, kernel, n), circular_conv_dense(x, kernel, n)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    for name, got, ref in zip(("x", "kernel"), torch.autograd.grad(y, (x, kernel), cotangent),
                              torch.autograd.grad(want, (x, kernel), cotangent)):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12, msg=f"gradient w.r.t. {name}")


def test_fft_sizes_are_the_least_5_smooth():
    smooth = [n for n in range(1, 200) if all(p in (2, 3, 5) for p in prime_factors(n))]
    for length in range(1, 190):
        assert fft_size(length) == min(n for n in smooth if n >= length)
    assert conv_size(4096) == 8192 and conv_size(1000) == 2000 and conv_size(1025) == 2160


def prime_factors(n):
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors
