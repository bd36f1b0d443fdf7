"""FLASH-Quad and FLASH (mixed chunk) against their defining formulas in ``transformer_vq.ops.flash.naive``."""

from __future__ import annotations

import pytest
import torch
from opsutil import (BLOCK_LEN, GRID, HEADS, case_id, check_causal_by_jacobian, check_documents,
                     check_matches_naive_float32,
                     check_matches_naive_float64, check_state_continuation, make_inputs)

from transformer_vq.ops.flash import (FlashState, flash_attention, flash_attention_naive, flash_quad_attention,
                                      flash_quad_attention_naive)


def _flash(chunk_len):
    return (lambda q, k, v, b, state=None: flash_attention(q, k, v, b, block_len=BLOCK_LEN, chunk_len=chunk_len,
                                                           state=state),
            lambda q, k, v, b: flash_attention_naive(q, k, v, b, block_len=BLOCK_LEN, chunk_len=chunk_len))


OPERATORS = {
    "flash_quad": (lambda q, k, v, b, state=None: flash_quad_attention(q, k, v, b, block_len=BLOCK_LEN, state=state),
                   lambda q, k, v, b: flash_quad_attention_naive(q, k, v, b, block_len=BLOCK_LEN)),
    # Chunks shorter than, equal to and longer than the block of the window bias.
    "flash_C2": _flash(2),
    "flash_C4": _flash(4),
    "flash_C16": _flash(16),
}


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("n_head,n_group,length", GRID, ids=[case_id(*c) for c in GRID])
def test_matches_naive_float64(name, n_head, n_group, length):
    check_matches_naive_float64(*OPERATORS[name], n_head, n_group, length)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_matches_naive_float32(name):
    check_matches_naive_float32(*OPERATORS[name])


@pytest.mark.parametrize("name", list(OPERATORS))
def test_causal_by_jacobian(name):
    check_causal_by_jacobian(OPERATORS[name][0])


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_state_continuation(name, n_head, n_group):
    check_state_continuation(*OPERATORS[name], n_head, n_group)


def test_flash_with_one_chunk_is_flash_quad():
    for length in (5, 16):
        q, k, v, bias = make_inputs(4, 2, length)
        quad, _ = flash_quad_attention(q, k, v, bias, block_len=BLOCK_LEN, norm_len=16)
        mixed, state = flash_attention(q, k, v, bias, block_len=BLOCK_LEN, chunk_len=16)
        torch.testing.assert_close(mixed, quad, rtol=1e-12, atol=1e-12)
        assert state.n_chunks == length // 16


def test_state_holds_the_open_chunk_and_detaches():
    q, k, v, bias = make_inputs(2, 1, 9)
    k.requires_grad_()
    _, state = flash_attention(q, k, v, bias, block_len=BLOCK_LEN, chunk_len=4)
    assert isinstance(state, FlashState) and state.n_chunks == 2 and state.chunk_k.shape[2] == 1
    expected_sum = k[:, :, :8].transpose(-1, -2) @ v[:, :, :8]  # k v^T summed over the 8 keys of finished chunks
    torch.testing.assert_close(state.kv_sum, expected_sum, rtol=1e-12, atol=1e-12)
    detached = state.detach()
    assert not detached.kv_sum.requires_grad and not detached.chunk_k.requires_grad
    assert state.nbytes() == (8 * 5 + 8 + 5) * 2 * 8  # (Dk Dv + r Dk + r Dv) B float64 bytes, r = 1


def test_chunk_len_errors_are_named():
    q, k, v, bias = make_inputs(2, 1, 5)
    _, state = flash_attention(q, k, v, bias, block_len=BLOCK_LEN, chunk_len=4)
    with pytest.raises(ValueError, match="state was built with chunk_len=4, got chunk_len=2"):
        flash_attention(q, k, v, bias, block_len=BLOCK_LEN, chunk_len=2, state=state)
    with pytest.raises(ValueError, match="chunk_len must be a positive integer, got 0"):
        flash_attention(q, k, v, bias, block_len=BLOCK_LEN, chunk_len=0)


@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_flash_quad_packed_documents(n_head, n_group):
    check_documents(lambda *x, state=None, doc_start=None: flash_quad_attention(
                        *x, block_len=BLOCK_LEN, state=state, doc_start=doc_start),
                    lambda *x, doc_start=None: flash_quad_attention_naive(*x, block_len=BLOCK_LEN, doc_start=doc_start),
                    n_head, n_group)


@pytest.mark.parametrize("chunk_len", [2, 4, 16])
@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_flash_packed_documents(n_head, n_group, chunk_len):
    """Documents begin inside chunks, on chunk edges, several in one chunk: the quadratic part sums over the query's
    document in its chunk, the linear part over its document's keys in earlier chunks (their mean)."""
    check_documents(lambda *x, state=None, doc_start=None: flash_attention(
                        *x, block_len=BLOCK_LEN, chunk_len=chunk_len, state=state, doc_start=doc_start),
                    lambda *x, doc_start=None: flash_attention_naive(*x, block_len=BLOCK_LEN, chunk_len=chunk_len,
                                                                     doc_start=doc_start),
                    n_head, n_group)


@pytest.mark.parametrize("norm_len", [0, -2, 2.5, True])
def test_norm_len_must_be_a_positive_integer(norm_len):
    """The scores are divided by ``norm_len``: 0 gave NaN everywhere, a negative one flipped their sign."""
    q, k, v, bias = make_inputs(2, 1, 12)
    with pytest.raises(ValueError, match=f"norm_len must be a positive integer, got {norm_len!r}"):
        flash_quad_attention(q, k, v, bias, block_len=BLOCK_LEN, norm_len=norm_len)
