"""VQ attention without the compressive cache (``compressive_cache=False``): the two-block window alone.

The operator is held to the dense formula with the window-only mask, in pieces as in one call, with a state that
stays constant-size and carries no cache.
"""

from __future__ import annotations

import pytest
import torch
from opsutil import VQ_GRID, make_vq_inputs, vq_grid_id

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.full.naive import window_mask
from transformer_vq.ops.vq import vq_attention, vq_attention_naive
from transformer_vq.ops.vq_qk import code_pair_table, vq_qk_attention


def window_only(inputs, L, **options):
    q, k_hat, z, v, codebook, bias = inputs
    return vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, compressive_cache=False, **options)


def test_window_mask_by_hand():
    # L = 2: queries 0-1 see keys 0..t; queries 2-3 see 0..t; query 4 sees 2..4; query 5 sees 2..5.
    want = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                         [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(window_mask(6, 2), want)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", VQ_GRID, ids=vq_grid_id)
def test_equals_window_only_dense_formula_float64(params, reduction):
    B, H, G, T, L, S = params
    inputs = [x.requires_grad_() if x.is_floating_point() else x for x in make_vq_inputs(B, H, G, T, L, S)]
    q, k_hat, z, v, codebook, bias = inputs
    out, state = window_only(inputs, L, reduction=reduction)
    want = vq_attention_naive(q, k_hat, v, bias, block_len=L, compressive_cache=False)
    # float64: the two differ only in summation order.
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k_hat, v, bias), cotangent)
    expected = torch.autograd.grad(want, (q, k_hat, v, bias), cotangent)
    # without a cache every key a query reads is a window key: every gradient is the formula's, k_hat's included
    for name, a, b in zip(("q", "k_hat", "v", "bias"), got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"grad {name}: {m}")
    assert state.cache_count.abs().sum() == 0 and state.cache_mean.abs().sum() == 0


def test_differs_from_the_compressive_cache_beyond_the_window():
    B, H, G, T, L, S = 1, 1, 1, 24, 4, 3
    q, k_hat, z, v, codebook, bias = inputs = make_vq_inputs(B, H, G, T, L, S)
    out, _ = window_only(inputs, L)
    full, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    # the first two blocks have no older keys: identical; every later query loses its cache
    torch.testing.assert_close(out[:, :, :2 * L], full[:, :, :2 * L], rtol=1e-12, atol=1e-12)
    assert (out[:, :, 2 * L:] - full[:, :, 2 * L:]).abs().amax(dim=-1).min() > 1e-6


@pytest.mark.parametrize("bounds", [[0, 3, 4, 13, 14, 30, 45], list(range(46))], ids=["cuts", "one-token"])
def test_pieces_with_state_equal_one_call_and_state_stays_small(bounds):
    B, H, G, T, L, S = 2, 2, 1, 45, 4, 5
    q, k_hat, z, v, codebook, bias = inputs = make_vq_inputs(B, H, G, T, L, S)
    whole, whole_state = window_only(inputs, L)
    state, pieces, sizes = None, [], set()
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = vq_attention(q[:, :, a:b], k_hat[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], block_len=L,
                                  state=state, z=z[:, :, a:b], codebook=codebook, compressive_cache=False)
        pieces.append(out)
        assert state.recent_k.shape[2] <= 2 * L - 1
        sizes.add(state.nbytes())
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-12, atol=1e-12)
    # the window's keys (fewer than 2L) and an empty cache of fixed size: at most 2L - 1 distinct sizes over 45 calls
    assert len(sizes) <= 2 * L - 1 and state.nbytes() == whole_state.nbytes()
    assert torch.equal(state.recent_z, whole_state.recent_z) and state.cache_count.sum() == 0


def test_quantized_queries_pass_the_option_through():
    B, H, G, T, L, S = 1, 2, 1, 19, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, seed=3)
    codebook_q = torch.randn(H, 4, q.shape[-1], dtype=q.dtype, generator=torch.Generator().manual_seed(4))
    z_q = torch.randint(0, 4, (B, H, T), generator=torch.Generator().manual_seed(5))
    q_hat = codebook_q[torch.arange(H)[None, :, None], z_q]
    out, _ = vq_qk_attention(q_hat, k_hat, v, bias, block_len=L, z_q=z_q, codebook_q=codebook_q, z=z,
                             codebook=codebook, table=code_pair_table(codebook_q, codebook), compressive_cache=False)
    want = vq_attention_naive(q_hat, k_hat, v, bias, block_len=L, compressive_cache=False)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
