"""The VQ operator's state: split calls equal one call (down to one token per call), bounded size, detach."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from opsutil import DOC_STARTS, assert_same_state, doc_start_mask, host_reads_refused, make_vq_inputs, vq_grid_id

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
    assert calls == ([per_segment * L] * (blocks // per_segment)
                     + [blocks % per_segment * L] * (blocks % per_segment > 0))
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    assert_same_state(state, want_state.detach(), 1e-12)


def test_a_state_of_another_block_length_is_refused():
    """Which keys a state holds verbatim and which it summarizes depends on ``L``: continuing it with another ``L``
    gives numbers of neither operator (a longer ``L`` ran without error before the state recorded its own)."""
    B, H, G, T, L, S = 1, 2, 1, 16, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    _, state = vq_attention(q[:, :, :8], k_hat[:, :, :8], v[:, :, :8], bias[:, :, :8], block_len=L, z=z[:, :, :8],
                            codebook=codebook)
    assert state.block_len == L and state.detach().block_len == L
    for other in (8, 6, 2):
        q2, k2, z2, v2, _, bias2 = make_vq_inputs(B, H, G, T, other, S)
        with pytest.raises(ValueError, match=f"state was built with block_len=4, got block_len={other}"):
            vq_attention(q2[:, :, 8:], k2[:, :, 8:], v2[:, :, 8:], bias2[:, :, 8:], block_len=other,
                         z=z2[:, :, 8:], codebook=codebook, state=state)


def test_states_that_do_not_record_a_block_length_still_continue():
    """``block_len`` None: a state saved before it was recorded (a checkpoint's carried state), or an empty state
    from ``empty(offset=...)``: accepted, with the same numbers as before."""
    B, H, G, T, L, S = 2, 2, 1, 19, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    whole, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    first, state = vq_attention(q[:, :, :9], k_hat[:, :, :9], v[:, :, :9], bias[:, :, :9], block_len=L,
                                z=z[:, :, :9], codebook=codebook)
    rest, _ = vq_attention(q[:, :, 9:], k_hat[:, :, 9:], v[:, :, 9:], bias[:, :, 9:], block_len=L, z=z[:, :, 9:],
                           codebook=codebook, state=dataclasses.replace(state, block_len=None))
    torch.testing.assert_close(torch.cat([first, rest], dim=2), whole, rtol=1e-12, atol=1e-12)
    assert attention.VQAttentionState.empty(B, G, S, 6, 7, dtype=torch.float64, offset=5).block_len is None


@pytest.mark.parametrize("defect, message", [
    ("batch", r"state.cache_count is \[2, 1, 3\], this call needs \[1, 1, 3\]"),
    ("values", r"state.cache_mean is \[2, 1, 3, 7\], this call needs \[2, 1, 3, 5\]"),
    ("codebook", r"state.cache_count is \[2, 1, 3\], this call needs \[2, 1, 4\]"),
    ("window", r"state holds 18 window keys, at most 2 \* block_len - 1 = 7"),
])
def test_a_state_of_other_sizes_is_refused(defect, message):
    B, H, G, T, L, S = 2, 2, 1, 12, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    _, state = vq_attention(q[:, :, :6], k_hat[:, :, :6], v[:, :, :6], bias[:, :, :6], block_len=L, z=z[:, :, :6],
                            codebook=codebook)
    rest = [x[:, :, 6:] for x in (q, k_hat, z, v, bias)]
    if defect == "batch":
        rest = [x[:1] for x in rest]
    elif defect == "values":
        rest[3] = rest[3][..., :5]
    elif defect == "codebook":
        codebook = torch.cat([codebook, codebook[:, :1]], dim=1)
    elif defect == "window":
        state = dataclasses.replace(state, **{name: torch.cat([getattr(state, name)] * 3, dim=-2 if name in (
            "recent_k", "recent_v") else -1) for name in ("recent_k", "recent_v", "recent_z", "recent_start")})
    q2, k2, z2, v2, bias2 = rest
    with pytest.raises(ValueError, match=message):
        vq_attention(q2, k2, v2, bias2, block_len=L, z=z2, codebook=codebook, state=state)


def test_codes_outside_the_codebook_are_named():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 2, 1, 8, 4, 3)
    for bad in (3, -1):
        z_bad = z.clone()
        z_bad[0, 0, 5] = bad
        with pytest.raises(ValueError, match=rf"z must lie in \[0, S\) = \[0, 3\), got codes from {min(bad, 0)} to"):
            vq_attention(q, k_hat, v, bias, block_len=4, z=z_bad, codebook=codebook)


@pytest.mark.parametrize("packed", [False, True])
def test_a_continuing_call_reads_nothing_off_the_device(packed, monkeypatch):
    """Decoding token by token reads no value of its state to decide how to attend: whether the window may hold a
    document start is a host-side flag of the state, set by the calls with ``doc_start`` (it once cost a device sync
    per token and layer). A state of packed documents goes on hiding them from later calls without ``doc_start``."""
    L, T = 4, 14
    q, k_hat, z, v, codebook, bias = make_vq_inputs(2, 2, 1, T, L, 5)
    starts = doc_start_mask([[0, 9], [0, 11]], 12) if packed else None
    whole, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook,
                            doc_start=None if starts is None else torch.cat([starts, starts.new_zeros(2, 2)], 1))
    _, state = vq_attention(q[:, :, :12], k_hat[:, :, :12], v[:, :, :12], bias[:, :, :12], block_len=L,
                            z=z[:, :, :12], codebook=codebook, doc_start=starts)
    assert state.documents == packed
    with monkeypatch.context() as patch:
        host_reads_refused(patch)
        outs = []
        for t in (12, 13):  # two decoded tokens, the second completing a block
            out, state = vq_attention(q[:, :, t:t + 1], k_hat[:, :, t:t + 1], v[:, :, t:t + 1], bias[:, :, t:t + 1],
                                      block_len=L, z=z[:, :, t:t + 1], codebook=codebook, state=state)
            outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), whole[:, :, 12:], rtol=1e-12, atol=1e-12)
