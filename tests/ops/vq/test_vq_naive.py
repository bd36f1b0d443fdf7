"""The linear-time operator against both naive oracles: the dense formula and the block-by-block loop.

Every reduction is compared with both, for outputs, final states and gradients, at awkward sizes.
"""

from __future__ import annotations

import pytest
import torch
from opsutil import VQ_GRID as GRID, assert_same_state, make_vq_inputs, vq_grid_id as grid_id

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention, vq_attention_blockwise, vq_attention_naive
from transformer_vq.ops.window import window_bias_dense

# float64: only the summation order differs, so near machine precision. float32: rounding differs between the factored
# and the dense sums (different summation orders, running means instead of raw sums), each ~1e-7 relative; 1e-5
# leaves room for O(T) accumulation.
PRECISIONS = {"float64": (torch.float64, 1e-12), "float32": (torch.float32, 1e-5)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_matches_reference(params, reduction, precision):
    B, H, G, T, L, S = params
    dtype, tol = PRECISIONS[precision]
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=dtype)
    out, state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    ref = vq_attention_naive(q, k_hat, v, bias, block_len=L)
    assert out.shape == (B, H, T, v.shape[-1])
    assert state.offset == T
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    blockwise, blockwise_state = vq_attention_blockwise(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    torch.testing.assert_close(out, blockwise, rtol=tol, atol=tol)
    assert_same_state(state, blockwise_state, tol)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_gradients_match_reference(params, reduction):
    """d/dq, d/dv, d/dbias equal the dense formula's; d/dk_hat equals it for window keys only."""
    B, H, G, T, L, S = params
    inputs = make_vq_inputs(B, H, G, T, L, S)
    q, k_hat, z, v, codebook, bias = (x.requires_grad_(x.is_floating_point() and x is not inputs[4]) for x in inputs)
    weight = torch.randn(B, H, T, v.shape[-1], dtype=q.dtype, generator=torch.Generator().manual_seed(1))

    out, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    grads = torch.autograd.grad((out * weight).sum(), (q, k_hat, v, bias))

    # Reference: the same dense formula, but with keys older than the window detached, which is
    # exactly the paper's gradient approximation (older keys enter through the constant codebook).
    pos = torch.arange(T)
    window_start = (pos // L - 1) * L
    ref_out = _reference_with_detached_old_keys(q, k_hat, v, bias, L, window_start)
    ref_grads = torch.autograd.grad((ref_out * weight).sum(), (q, k_hat, v, bias))
    for name, got, want in zip(("q", "k_hat", "v", "bias"), grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name}")

    # q, v, bias: identical to the plain reference too (the detach does not touch them).
    plain = torch.autograd.grad((vq_attention_naive(q, k_hat, v, bias, block_len=L) * weight).sum(), (q, v, bias))
    for name, got, want in zip(("q", "v", "bias"), (grads[0], grads[2], grads[3]), plain):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name}")

    # The block loop attends old keys through the (constant) codebook: all four gradients are the operator's.
    blockwise, _ = vq_attention_blockwise(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    loop_grads = torch.autograd.grad((blockwise * weight).sum(), (q, k_hat, v, bias))
    for name, got, want in zip(("q", "k_hat", "v", "bias"), grads, loop_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name} (block loop)")


def _reference_with_detached_old_keys(q, k_hat, v, bias, L, window_start):
    """Dense attention where key p, seen from query t, is detached when p < w(t)."""
    B, H, T, _ = q.shape
    G = k_hat.shape[1]
    k_rep = k_hat.repeat_interleave(H // G, dim=1)
    v_rep = v.repeat_interleave(H // G, dim=1)
    live = q @ k_rep.transpose(-1, -2)
    frozen = q @ k_rep.detach().transpose(-1, -2)
    old = torch.arange(T)[None, :] < window_start[:, None]  # (T, T): key p older than query t's window
    scores = torch.where(old, frozen, live) + window_bias_dense(bias, L)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1) @ v_rep


def test_key_gradient_is_truncated_outside_window():
    """The documented approximation, stated as a fact: the exact key gradient differs for old keys."""
    B, H, G, T, L, S = 1, 1, 1, 24, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    k_hat.requires_grad_(True)
    out, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    (grad,) = torch.autograd.grad(out[:, :, -1].sum(), k_hat)  # the last query only
    last_window_start = ((T - 1) // L - 1) * L
    assert torch.all(grad[:, :, :last_window_start] == 0)
    assert torch.any(grad[:, :, last_window_start:] != 0)
    ref = vq_attention_naive(q, k_hat, v, bias, block_len=L)
    (exact,) = torch.autograd.grad(ref[:, :, -1].sum(), k_hat)
    assert torch.any(exact[:, :, :last_window_start] != 0)
