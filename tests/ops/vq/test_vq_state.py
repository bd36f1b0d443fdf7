"""The VQ operator's state: split calls equal one call (down to one token per call), bounded size, detach."""

from __future__ import annotations

import pytest
import torch
from opsutil import assert_same_state, make_vq_inputs, vq_grid_id

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention, vq_attention_blockwise


def run_in_pieces(inputs, bounds, L, **options):
    """One call per piece ``[a, b)`` of ``bounds``, the state carried; the outputs concatenated and the last state."""
    q, k_hat, z, v, codebook, bias = inputs
    state, pieces = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = vq_attention(q[:, :, a:b], k_hat[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], block_len=L,
                                  state=state, z=z[:, :, a:b], codebook=codebook, **options)
        pieces.append(out)
        assert state.recent_k.shape[2] <= 2 * L - 1  # bounded state: nothing grows with position
    return torch.cat(pieces, dim=2), state


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_state_continuation_random_splits(seed, reduction):
    B, H, G, T, L, S = 2, 2, 1, 71, 8, 5
    q, k_hat, z, v, codebook, bias = inputs = make_vq_inputs(B, H, G, T, L, S, seed=seed)
    whole, whole_state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    gen = torch.Generator().manual_seed(100 + seed)
    cuts = sorted(set(torch.randint(1, T, (5,), generator=gen).tolist()))
    pieces, state = run_in_pieces(inputs, [0, *cuts, T], L, reduction=reduction)
    torch.testing.assert_close(pieces, whole, rtol=1e-12, atol=1e-12)
    assert state.offset == whole_state.offset == T
    torch.testing.assert_close(state.cache_count, whole_state.cache_count, rtol=0, atol=0)
    torch.testing.assert_close(state.cache_mean, whole_state.cache_mean, rtol=1e-12, atol=1e-12)
    # The state after the pieces is the one the block loop builds from the whole sequence.
    assert_same_state(state, vq_attention_blockwise(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)[1], 1e-12)


@pytest.mark.parametrize("params", [(1, 1, 1, 40, 8, 4), (2, 4, 1, 23, 4, 3), (1, 2, 2, 19, 4, 2)], ids=vq_grid_id)
def test_one_token_at_a_time(params):
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = inputs = make_vq_inputs(B, H, G, T, L, S)
    whole, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    pieces, _ = run_in_pieces(inputs, list(range(T + 1)), L)
    torch.testing.assert_close(pieces, whole, rtol=1e-12, atol=1e-12)


def test_state_detach_cuts_the_graph():
    B, H, G, T, L, S = 1, 1, 1, 12, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    v.requires_grad_(True)
    _, state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    assert state.cache_mean.requires_grad
    detached = state.detach()
    assert not detached.cache_mean.requires_grad and detached.offset == state.offset
    assert detached.nbytes() == state.nbytes() > 0
