"""``full_attention`` (softmax over every past key, through SDPA) against its dense formula in ``naive.py``."""

from __future__ import annotations

import pytest
import torch
from opsutil import (BLOCK_LEN, GRID, HEADS, case_id, check_causal_by_jacobian, check_documents,
                     check_matches_naive_float32,
                     check_matches_naive_float64, check_state_continuation, make_inputs)

from transformer_vq.ops.full import KVCache, full_attention, full_attention_naive
from transformer_vq.ops.vq import vq_attention_naive


def op(q, k, v, bias, state=None):
    return full_attention(q, k, v, bias, block_len=BLOCK_LEN, state=state)


def naive(q, k, v, bias):
    return full_attention_naive(q, k, v, bias, block_len=BLOCK_LEN)


@pytest.mark.parametrize("n_head,n_group,length", GRID, ids=[case_id(*c) for c in GRID])
def test_matches_naive_float64(n_head, n_group, length):
    check_matches_naive_float64(op, naive, n_head, n_group, length)


def test_matches_naive_float32():
    check_matches_naive_float32(op, naive)


def test_causal_by_jacobian():
    check_causal_by_jacobian(op)


@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_state_continuation(n_head, n_group):
    check_state_continuation(op, naive, n_head, n_group)


def test_full_equals_vq_dense_formula():
    """``full`` is Definition 3.1, the VQ operator's dense formula, with the keys left unquantized."""
    for n_head, n_group in HEADS:
        q, k, v, bias = make_inputs(n_head, n_group, 37)
        out, _ = full_attention(q, k, v, bias, block_len=BLOCK_LEN)
        expected = vq_attention_naive(q, k, v, bias, block_len=BLOCK_LEN)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_cache_holds_every_key_and_detaches():
    q, k, v, bias = make_inputs(2, 1, 9)
    k.requires_grad_()
    _, cache = full_attention(q, k, v, bias, block_len=BLOCK_LEN)
    assert isinstance(cache, KVCache) and cache.k.requires_grad and not cache.detach().k.requires_grad
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v) and cache.offset == 9
    assert cache.nbytes() == (9 * 8 + 9 * 5) * 2 * 8  # (T Dk + T Dv) B float64 bytes


@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_packed_documents(n_head, n_group):
    check_documents(lambda *x, state=None, doc_start=None: full_attention(*x, block_len=BLOCK_LEN, state=state,
                                                                          doc_start=doc_start),
                    lambda *x, doc_start=None: full_attention_naive(*x, block_len=BLOCK_LEN, doc_start=doc_start),
                    n_head, n_group)
