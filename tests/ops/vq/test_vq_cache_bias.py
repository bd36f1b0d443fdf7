"""``cache_bias``: a learned logit per query head on every key older than the two-block window (docs/operator.md).

The dense formula adds ``b_h`` to the score of each key ``p < (t // L - 1) L``; the operator adds it to each cache
entry's ``q . C_s + log c[s]``. Both oracles are held to that, in float64 to 1e-12: outputs, the final state, and
every gradient, ``d cache_bias`` included, with the state carried over many calls and with packed documents.
"""

from __future__ import annotations

import pytest
import torch
from opsutil import (DOC_STARTS, VQ_GRID as GRID, assert_same_state, doc_start_mask, make_vq_inputs,
                     vq_grid_id as grid_id)

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention, vq_attention_blockwise, vq_attention_naive
from transformer_vq.ops.vq.context_parallel import vq_attention_context_parallel_reference

TOL = 1e-12  # float64: only the summation order differs from the references
NAMES = ("q", "k_hat", "v", "bias", "cache_bias")


def biased_inputs(B, H, G, T, L, S, seed=0):
    """``(q, k_hat, v, bias, cache_bias)`` as leaves, ``z`` and ``codebook``; biases of both signs and sizes that
    move the softmax (a zero bias would test nothing)."""
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, seed=seed)
    cache_bias = torch.linspace(-2.5, 1.5, H, dtype=q.dtype)
    return [x.requires_grad_() for x in (q, k_hat, v, bias, cache_bias)], z, codebook


def gradients(out, leaves, seed=1):
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, leaves, cotangent)


def assert_all_close(got, want, names=NAMES):
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m: f"{name}: {m}")


def assert_matches_oracles(leaves, z, codebook, L, reduction, doc_start=None):
    """Output and state as both oracles; every gradient as the block loop's, and all but k_hat's as the dense
    formula's (k_hat's differs there by the paper's truncation, docs/operator.md)."""
    q, k_hat, v, bias, cache_bias = leaves
    out, state = call(leaves, z, codebook, L, reduction=reduction, doc_start=doc_start)
    dense = vq_attention_naive(q, k_hat, v, bias, block_len=L, doc_start=doc_start, cache_bias=cache_bias)
    blockwise, blockwise_state = vq_attention_blockwise(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook,
                                                        doc_start=doc_start, cache_bias=cache_bias)
    torch.testing.assert_close(out, dense, rtol=TOL, atol=TOL)
    torch.testing.assert_close(out, blockwise, rtol=TOL, atol=TOL)
    assert_same_state(state, blockwise_state, TOL)
    got = gradients(out, leaves)
    assert_all_close(got, gradients(blockwise, leaves))
    keep = (0, 2, 3, 4)
    dense_grads = gradients(dense, leaves)
    assert_all_close([got[i] for i in keep], [dense_grads[i] for i in keep], [NAMES[i] for i in keep])


def call(leaves, z, codebook, L, **options):
    q, k_hat, v, bias, cache_bias = leaves
    return vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, cache_bias=cache_bias, **options)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_matches_the_dense_formula_and_the_block_loop(params, reduction):
    B, H, G, T, L, S = params
    assert_matches_oracles(*biased_inputs(B, H, G, T, L, S), L, reduction)


def test_the_bias_moves_mass_off_the_cache():
    """A very negative bias leaves the window alone; the bias is not a no-op (the test above could not fail else)."""
    B, H, G, T, L, S = 2, 2, 1, 40, 4, 5
    leaves, z, codebook = biased_inputs(B, H, G, T, L, S)
    q, k_hat, v, bias, _ = leaves
    far = torch.full((H,), -1e4, dtype=q.dtype)
    out, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, cache_bias=far)
    window = vq_attention_naive(q, k_hat, v, bias, block_len=L, compressive_cache=False)
    torch.testing.assert_close(out, window, rtol=TOL, atol=TOL)
    plain, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    assert (out - plain).abs().max() > 1e-2


def test_zero_bias_is_the_paper_operator_bit_for_bit():
    B, H, G, T, L, S = 2, 4, 1, 37, 4, 5
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=torch.float32)
    plain, plain_state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    zero, zero_state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook,
                                    cache_bias=torch.zeros(H))
    assert torch.equal(plain, zero)
    assert torch.equal(plain_state.cache_mean, zero_state.cache_mean)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bounds", [[0, 3, 8, 9, 21, 30, 71], [0, 16, 40, 71], list(range(72))],
                         ids=["ragged", "blocks", "one-token"])
def test_state_carried_over_many_calls_equals_one_call(bounds, reduction):
    """Outputs, the final state and every gradient, d cache_bias summed over the calls, as one call."""
    B, H, G, T, L, S = 2, 4, 2, 71, 8, 5
    leaves, z, codebook = biased_inputs(B, H, G, T, L, S, seed=3)
    q, k_hat, v, bias, cache_bias = leaves
    whole, whole_state = call(leaves, z, codebook, L, reduction=reduction)
    state, pieces = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = vq_attention(q[:, :, a:b], k_hat[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], block_len=L,
                                  state=state, z=z[:, :, a:b], codebook=codebook, reduction=reduction,
                                  cache_bias=cache_bias)
        pieces.append(out)
    pieces = torch.cat(pieces, dim=2)
    torch.testing.assert_close(pieces, whole, rtol=TOL, atol=TOL)
    assert_same_state(state, whole_state, TOL)
    assert_all_close(gradients(pieces, leaves), gradients(whole, leaves))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_packed_documents(reduction):
    """With doc_start: the masked dense formula (q, v, bias, cache_bias) and the block loop (everything)."""
    B, H, G, T, L, S = 2, 4, 2, 37, 4, 5
    assert_matches_oracles(*biased_inputs(B, H, G, T, L, S), L, reduction, doc_start_mask(DOC_STARTS, T))


def test_context_parallel_takes_it():
    """Simulated ranks hand each other the cache; the bias rides along with the other options."""
    B, H, G, T, L, S = 2, 2, 1, 48, 4, 5
    leaves, z, codebook = biased_inputs(B, H, G, T, L, S)
    q, k_hat, v, bias, cache_bias = leaves
    whole, whole_state = call(leaves, z, codebook, L)
    ranks, ranks_state = vq_attention_context_parallel_reference(q, k_hat, v, bias, block_len=L, ranks=3, z=z,
                                                                 codebook=codebook, cache_bias=cache_bias)
    torch.testing.assert_close(ranks, whole, rtol=TOL, atol=TOL)
    assert_same_state(ranks_state, whole_state, TOL)
    assert_all_close(gradients(ranks, leaves), gradients(whole, leaves))


@pytest.mark.parametrize("options, message", [
    ({"cache_bias": torch.zeros(3)}, "cache_bias must be [H] = [2] (one logit per query head), got [3]"),
    ({"cache_bias": torch.zeros(2), "compressive_cache": False},
     "cache_bias is added to the scores of the per-code cache: with compressive_cache=False there is none; pass "
     "cache_bias=None"),
    ({"cache_bias": torch.zeros(2), "backend": "triton"},
     "cache_bias is taken by backend='eager' only (the fused kernels' log-counts carry no gradient), got "
     "backend='triton'"),
    ({"cache_bias": 0.5}, "cache_bias must be [H] = [2] (one logit per query head), got float"),
    # +inf gave every output row NaN, the first query's too (it has no older key): -inf + inf
    ({"cache_bias": torch.tensor([float("inf"), 0.0])}, "cache_bias must be finite (no inf or NaN), got [inf, 0.0]"),
    ({"cache_bias": torch.tensor([0.0, float("nan")])}, "cache_bias must be finite (no inf or NaN), got [0.0, nan]"),
], ids=["shape", "window-only", "triton", "float", "inf", "nan"])
def test_refused(options, message):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 2, 1, 9, 4, 3, dtype=torch.float32)
    with pytest.raises(ValueError) as caught:
        vq_attention(q, k_hat, v, bias, block_len=4, z=z, codebook=codebook, **options)
    assert str(caught.value) == message


def test_dense_formula_refuses_it_without_the_cache():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 2, 1, 9, 4, 3)
    with pytest.raises(ValueError, match="with compressive_cache=False there are none"):
        vq_attention_naive(q, k_hat, v, bias, block_len=4, compressive_cache=False, cache_bias=torch.zeros(2))
