"""The linear-time operator against the dense formula: outputs, gradients, state, causality, cost."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer_vq.ops import REDUCTIONS, vq_attention, vq_attention_reference


def make_inputs(B, H, G, T, L, S, Dk=6, Dv=7, *, dtype=torch.float64, seed=0, scale=1.0, codes=None):
    """Random operator inputs with ``k_hat = codebook[z]`` exactly, as the quantizer produces."""
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.randn(G, S, Dk, generator=gen, dtype=dtype)
    z = torch.randint(0, S, (B, G, T), generator=gen) if codes is None else codes
    k_hat = codebook[torch.arange(G)[None, :, None], z]  # (B, G, T, Dk)
    q = scale * torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, G, T, Dv, generator=gen, dtype=dtype)
    bias = torch.randn(B, H, T, 2 * L, generator=gen, dtype=dtype)
    return q, k_hat, z, v, codebook, bias


# (B, H, G, T, L, S): T < L, T = 1, T not a multiple of L, B = 1, S = 1, (H, G) in {(1,1), (2,2), (4,1)}
GRID = [
    (2, 1, 1, 5, 8, 4),
    (1, 1, 1, 1, 4, 3),
    (2, 2, 2, 37, 8, 5),
    (1, 4, 1, 50, 4, 1),
    (2, 1, 1, 64, 8, 6),
    (1, 2, 2, 63, 16, 9),
    (2, 4, 1, 17, 4, 2),
]


def grid_id(params):
    B, H, G, T, L, S = params
    return f"B{B}-H{H}-G{G}-T{T}-L{L}-S{S}"


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_matches_reference_float64(params, reduction):
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S)
    out, state = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
    ref = vq_attention_reference(q, k_hat, v, bias, block_len=L)
    assert out.shape == (B, H, T, v.shape[-1])
    assert state.offset == T
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_matches_reference_float32(params, reduction):
    # float32 rounding differs between the factored and the dense sums (different summation orders,
    # running means instead of raw sums), each ~1e-7 relative; 1e-5 leaves room for O(T) accumulation.
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, dtype=torch.float32)
    out, _ = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
    ref = vq_attention_reference(q, k_hat, v, bias, block_len=L)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_gradients_match_reference(params, reduction):
    """d/dq, d/dv, d/dbias equal the dense formula's; d/dk_hat equals it for window keys only."""
    B, H, G, T, L, S = params
    inputs = make_inputs(B, H, G, T, L, S)
    q, k_hat, z, v, codebook, bias = (x.requires_grad_(x.is_floating_point() and x is not inputs[4]) for x in inputs)
    weight = torch.randn(B, H, T, v.shape[-1], dtype=q.dtype, generator=torch.Generator().manual_seed(1))

    out, _ = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
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
    plain = torch.autograd.grad((vq_attention_reference(q, k_hat, v, bias, block_len=L) * weight).sum(), (q, v, bias))
    for name, got, want in zip(("q", "v", "bias"), (grads[0], grads[2], grads[3]), plain):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name}")


def _reference_with_detached_old_keys(q, k_hat, v, bias, L, window_start):
    """Dense attention where key p, seen from query t, is detached when p < w(t)."""
    B, H, T, _ = q.shape
    G = k_hat.shape[1]
    k_rep = k_hat.repeat_interleave(H // G, dim=1)
    v_rep = v.repeat_interleave(H // G, dim=1)
    live = q @ k_rep.transpose(-1, -2)
    frozen = q @ k_rep.detach().transpose(-1, -2)
    old = torch.arange(T)[None, :] < window_start[:, None]  # (T, T): key p older than query t's window
    from transformer_vq.ops import window_bias_matrix

    scores = torch.where(old, frozen, live) + window_bias_matrix(bias, L)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1) @ v_rep


def test_key_gradient_is_truncated_outside_window():
    """The documented approximation, stated as a fact: the exact key gradient differs for old keys."""
    B, H, G, T, L, S = 1, 1, 1, 24, 4, 3
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S)
    k_hat.requires_grad_(True)
    out, _ = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L)
    (grad,) = torch.autograd.grad(out[:, :, -1].sum(), k_hat)  # the last query only
    last_window_start = ((T - 1) // L - 1) * L
    assert torch.all(grad[:, :, :last_window_start] == 0)
    assert torch.any(grad[:, :, last_window_start:] != 0)
    ref = vq_attention_reference(q, k_hat, v, bias, block_len=L)
    (exact,) = torch.autograd.grad(ref[:, :, -1].sum(), k_hat)
    assert torch.any(exact[:, :, :last_window_start] != 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_state_continuation_random_splits(seed, reduction):
    B, H, G, T, L, S = 2, 2, 1, 71, 8, 5
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, seed=seed)
    whole, whole_state = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
    gen = torch.Generator().manual_seed(100 + seed)
    cuts = sorted(set(torch.randint(1, T, (5,), generator=gen).tolist()))
    bounds = [0, *cuts, T]
    state, pieces = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = vq_attention(
            q[:, :, a:b], k_hat[:, :, a:b], z[:, :, a:b], v[:, :, a:b], codebook, bias[:, :, a:b],
            block_len=L, state=state, reduction=reduction,
        )
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-12, atol=1e-12)
    assert state.offset == whole_state.offset == T
    torch.testing.assert_close(state.cache_count, whole_state.cache_count, rtol=0, atol=0)
    torch.testing.assert_close(state.cache_mean, whole_state.cache_mean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params", [(1, 1, 1, 40, 8, 4), (2, 4, 1, 23, 4, 3), (1, 2, 2, 19, 4, 2)], ids=grid_id)
def test_one_token_at_a_time(params):
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S)
    whole, _ = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L)
    state, pieces = None, []
    for t in range(T):
        out, state = vq_attention(
            q[:, :, t:t + 1], k_hat[:, :, t:t + 1], z[:, :, t:t + 1], v[:, :, t:t + 1], codebook,
            bias[:, :, t:t + 1], block_len=L, state=state,
        )
        pieces.append(out)
        assert state.recent_k.shape[2] <= 2 * L - 1  # bounded state: nothing grows with position
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-12, atol=1e-12)


def test_decode_cost_is_independent_of_position():
    """A one-token call does the same arithmetic at position 3L+1 as at position 40L+1: O(S + 2L)."""
    B, H, G, L, S = 1, 1, 1, 8, 16
    T = 40 * L + 2
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, dtype=torch.float32)

    def flops_of_token(position):
        _, state = vq_attention(q[:, :, :position], k_hat[:, :, :position], z[:, :, :position],
                                v[:, :, :position], codebook, bias[:, :, :position], block_len=L)
        sl = slice(position, position + 1)
        with FlopCounterMode(display=False) as counter:
            vq_attention(q[:, :, sl], k_hat[:, :, sl], z[:, :, sl], v[:, :, sl], codebook, bias[:, :, sl],
                         block_len=L, state=state)
        return counter.get_total_flops()

    early, late = flops_of_token(3 * L + 1), flops_of_token(40 * L + 1)
    assert early == late > 0
    Dk, Dv = q.shape[-1], v.shape[-1]
    assert late <= 2 * (S + 2 * L) * (Dk + Dv)  # the matmuls of one query against S codes + 2L keys


def test_causality_by_jacobian():
    """d out_t / d x_s is zero for s > t and not all zero for s <= t (x = every input at position s)."""
    B, H, G, T, L, S = 1, 2, 1, 13, 4, 3
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S)

    def run(q, k_hat, v, bias):
        return vq_attention(q, k_hat, z, v, codebook, bias, block_len=L)[0]

    jac = torch.autograd.functional.jacobian(run, (q, k_hat, v, bias))
    for name, j in zip(("q", "k_hat", "v", "bias"), jac):
        # j: (B, H, T, Dv, B, heads, T, width) -> dependence of out_t on input position s
        dep = j.abs().sum(dim=(0, 1, 3, 4, 5, 7))  # (T_out, T_in)
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        assert torch.all(dep[future] == 0), f"out_t depends on future {name}"
    dep_v = jac[2].abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(dep_v[~torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)] > 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_keys_same_code_and_empty_cache(reduction):
    B, H, G, T, L, S = 1, 1, 1, 40, 4, 7
    codes = torch.full((B, G, T), 3)
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, codes=codes)
    out, state = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, vq_attention_reference(q, k_hat, v, bias, block_len=L), rtol=1e-12, atol=1e-12)
    assert state.cache_count[0, 0].tolist() == [0, 0, 0, T - L - T % L, 0, 0, 0]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_huge_scores_stay_finite(reduction):
    B, H, G, T, L, S = 1, 2, 2, 29, 4, 5
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, dtype=torch.float32, scale=1e4)
    q.requires_grad_(True)
    out, _ = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction=reduction)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    # Scores of ~1e4 carry float32 rounding of ~1e-3, which decides near-ties of the softmax, so the
    # value check is done in float64, where the scores are exact enough to compare.
    q64, k64, v64, b64, c64 = (x.detach().double() for x in (q, k_hat, v, bias, codebook))
    out64, _ = vq_attention(q64, k64, z, v64, c64, b64, block_len=L, reduction=reduction)
    torch.testing.assert_close(out64, vq_attention_reference(q64, k64, v64, b64, block_len=L), rtol=1e-9, atol=1e-9)


def test_counts_stay_float32_under_autocast():
    B, H, G, T, L, S = 1, 1, 1, 20, 4, 3
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L)
    assert state.cache_count.dtype == torch.float32
    assert state.cache_mean.dtype == torch.float32
    # bf16 matmuls carry ~3 significant digits; the outputs are convex combinations of O(1) values.
    torch.testing.assert_close(out.float(), vq_attention_reference(q, k_hat, v, bias, block_len=L), rtol=0.05, atol=0.05)


def test_state_detach_cuts_the_graph():
    B, H, G, T, L, S = 1, 1, 1, 12, 4, 3
    q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S)
    v.requires_grad_(True)
    _, state = vq_attention(q, k_hat, z, v, codebook, bias, block_len=L)
    assert state.cache_mean.requires_grad
    detached = state.detach()
    assert not detached.cache_mean.requires_grad and detached.offset == state.offset
    assert detached.nbytes() == state.nbytes() > 0


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(reduction="scan"), "reduction must be one of serial, matmul, assoc"),
        (dict(block_len=0), "block_len must be a positive integer"),
        (dict(bias_width=3), "bias must have shape"),
        (dict(z_dtype=torch.int32), "z must be int64 shortcodes"),
        (dict(heads=3), "must be a multiple of key/value groups"),
    ],
)
def test_bad_input_messages(change, message):
    B, H, G, T, L, S = 1, change.get("heads", 2), 2, 5, 4, 3
    q, k_hat, z, v, codebook, bias = make_inputs(B, 2, G, T, L, S)
    q = q[:, :1].expand(B, H, T, q.shape[-1]) if "heads" in change else q
    if "bias_width" in change:
        bias = bias[..., :3]
    if "z_dtype" in change:
        z = z.to(change["z_dtype"])
    with pytest.raises(ValueError, match=message):
        vq_attention(q, k_hat, z, v, codebook, bias, block_len=change.get("block_len", L),
                     reduction=change.get("reduction", "serial"))


def test_linear_scaling_of_work():
    """Arithmetic grows linearly with T: 4x the tokens, 4x the FLOPs (within the scan's small extra)."""
    B, H, G, L, S = 1, 1, 1, 16, 16
    counts = []
    for T in (8 * L, 32 * L):
        q, k_hat, z, v, codebook, bias = make_inputs(B, H, G, T, L, S, dtype=torch.float32)
        with FlopCounterMode(display=False) as counter:
            vq_attention(q, k_hat, z, v, codebook, bias, block_len=L, reduction="serial")
        counts.append(counter.get_total_flops())
    assert math.isclose(counts[1] / counts[0], 4.0, rel_tol=0.01)
