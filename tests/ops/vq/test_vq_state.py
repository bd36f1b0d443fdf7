"""The VQ operator's state: split calls equal one call (down to one token per call), bounded size, detach."""

from __future__ import annotations

import pytest
import torch
from opsutil import DOC_STARTS, assert_same_state, doc_start_mask, make_vq_inputs, vq_grid_id

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import attention, vq_attention, vq_attention_blockwise
from transformer_vq.ops.vq.kernels import attend_blocks


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


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("documents", [False, True], ids=["one-document", "packed"])
@pytest.mark.parametrize("rows", [1, 40])
def test_no_grad_segments_equal_one_call(monkeypatch, reduction, documents, rows):
    """Without autograd whole blocks go through the kernel a few blocks at a time (``SEGMENT_ROWS``), the state
    carried; that is the same computation as one call under autograd, to the last bit of float64 that the reduction
    allows, and the state after it is the same."""
    B, H, G, T, L, S = 2, 2, 1, 75, 4, 5
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    doc_start = doc_start_mask(DOC_STARTS, T) if documents else None
    options = dict(block_len=L, z=z, codebook=codebook, reduction=reduction, doc_start=doc_start)
    monkeypatch.setattr(attention, "SEGMENT_ROWS", rows)  # 1 or 2 blocks a segment (B H L = 16 rows a block)
    recording = v.clone().requires_grad_(True)
    want, want_state = vq_attention(q, k_hat, recording, bias, **options)
    calls = []
    monkeypatch.setattr(attention, "attend_blocks", lambda *a: calls.append(a[0].shape[2]) or attend_blocks(*a))
    with torch.no_grad():
        got, state = vq_attention(q, k_hat, v, bias, **options)
    per_segment, blocks = max(1, rows // (B * H * L)), T // L  # the last T % L queries: attend_within_block
    assert calls == [per_segment * L] * (blocks // per_segment) + [blocks % per_segment * L] * (blocks % per_segment > 0)
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    assert_same_state(state, want_state.detach(), 1e-12)
