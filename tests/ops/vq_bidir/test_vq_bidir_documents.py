"""Packed documents through non-causal VQ attention: every document gets exactly what it gets alone, in float64.

"Alone" has two exact forms. A document starting on a block edge is the sequence it would be from position 0 (its
blocks are the row's shifted by whole blocks). Any document, wherever it starts, equals the same row with every other
token padding (``mask`` False): the same block grid, nothing else real. Both hold for outputs and every gradient,
``k_hat`` included; the dense formula with a same-document mask holds for outputs and the gradients of ``q``, ``v``
and ``bias`` (the key gradient is truncated outside the window, docs/operator.md).
"""

from __future__ import annotations

import pytest
import torch
from opsutil import DOC_STARTS, doc_start_mask, documents, make_vq_inputs

from transformer_vq.ops.vq_bidir import SCORINGS, vq_bidir_attention, vq_bidir_attention_naive

TOL = 1e-12  # float64: only the summation order differs
B, H, G, T, L, S = 2, 4, 2, 37, 4, 5
NAMES = ("q", "k_hat", "v", "bias")
WINDOWS = ["nobias", "window"]


def packed_inputs(window, seed=0):
    q, k_hat, z, v, codebook, _ = make_vq_inputs(B, H, G, T, L, S, seed=seed)
    bias = torch.randn(B, H, T, 3 * L, dtype=q.dtype, generator=torch.Generator().manual_seed(seed + 1))
    leaves = [x.requires_grad_() for x in (q, k_hat, v, bias)]
    return leaves, z, codebook, window == "window"


def run(leaves, z, codebook, with_bias, **options):
    q, k_hat, v, bias = leaves
    return vq_bidir_attention(q, k_hat, v, bias if with_bias else None, block_len=L, z=z, codebook=codebook,
                              **options)[0]


def packed_run(scoring, window, seed):
    """The packed call on ``DOC_STARTS``: its inputs, output, a cotangent and the gradients it gives every input."""
    leaves, z, codebook, with_bias = packed_inputs(window, seed=seed)
    doc_start = doc_start_mask(DOC_STARTS, T)
    out = run(leaves, z, codebook, with_bias, scoring=scoring, doc_start=doc_start)
    cotangent = torch.randn_like(out)
    return (leaves, z, codebook, with_bias), doc_start, out, cotangent, gradients(out, leaves, cotangent)


def gradients(out, leaves, cotangent):
    return torch.autograd.grad(out, leaves, cotangent, allow_unused=True, materialize_grads=True)


def assert_all_close(got, want, names=NAMES, where=(slice(None),) * 3):
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a[where], b[where], rtol=TOL, atol=TOL, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_packed_matches_the_masked_dense_formula(scoring, window):
    leaves, z, codebook, with_bias = packed_inputs(window)
    doc_start = doc_start_mask(DOC_STARTS, T)
    out = run(leaves, z, codebook, with_bias, scoring=scoring, doc_start=doc_start)
    q, k_hat, v, bias = leaves
    dense = vq_bidir_attention_naive(q, k_hat, v, bias if with_bias else None, block_len=L, scoring=scoring,
                                     doc_start=doc_start)
    torch.testing.assert_close(out, dense, rtol=TOL, atol=TOL)
    cotangent = torch.randn_like(out)
    got, want = gradients(out, leaves, cotangent), gradients(dense, leaves, cotangent)
    assert_all_close([got[0], got[2], got[3]], [want[0], want[2], want[3]], ("q", "v", "bias"))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_each_document_equals_its_row_with_the_rest_padding(scoring, window):
    """Any start, mid-block ones included: the row with only this document real, outputs and every gradient."""
    (leaves, z, codebook, with_bias), doc_start, out, cotangent, packed_grads = packed_run(scoring, window, 1)
    for row, a, b in documents(doc_start):
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[row, a:b] = True
        alone = run(leaves, z, codebook, with_bias, scoring=scoring, mask=mask)
        where = (slice(row, row + 1), slice(None), slice(a, b))
        torch.testing.assert_close(out[where], alone[where], rtol=TOL, atol=TOL, msg=lambda m: f"[{a}, {b}): {m}")
        only_here = torch.zeros_like(cotangent)
        only_here[where] = cotangent[where]
        assert_all_close(packed_grads, gradients(alone, leaves, only_here), where=where)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_a_document_starting_on_a_block_edge_equals_it_from_position_zero(scoring, window):
    (leaves, z, codebook, with_bias), doc_start, out, cotangent, packed_grads = packed_run(scoring, window, 2)
    checked = 0
    for row, a, b in documents(doc_start):
        if a % L:
            continue
        where = (slice(row, row + 1), slice(None), slice(a, b))
        piece = [x[where].detach().requires_grad_() for x in leaves]
        alone = run(piece, z[where], codebook, with_bias, scoring=scoring)
        torch.testing.assert_close(out[where], alone, rtol=TOL, atol=TOL, msg=lambda m: f"[{a}, {b}): {m}")
        for name, got, want in zip(NAMES, packed_grads, gradients(alone, piece, cotangent[where])):
            torch.testing.assert_close(got[where], want, rtol=TOL, atol=TOL, msg=lambda m: f"grad {name}: {m}")
        checked += 1
    assert checked == 5  # rows 0 and 1 start at 0; row 0 at 4 and 24, row 1 at 16


@pytest.mark.parametrize("window", WINDOWS)
def test_packing_with_padding_and_no_starts(window):
    """Padding inside a packed row takes no part; a lone start at 0 is the unpacked operator."""
    leaves, z, codebook, with_bias = packed_inputs(window, seed=3)
    unpacked = run(leaves, z, codebook, with_bias)
    first_only = doc_start_mask(([0], [0]), T)
    torch.testing.assert_close(run(leaves, z, codebook, with_bias, doc_start=first_only), unpacked, rtol=TOL,
                               atol=TOL)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, 14:20] = False  # the end of one document and the start of the next, and a whole document of row 0
    doc_start = doc_start_mask(DOC_STARTS, T)
    out = run(leaves, z, codebook, with_bias, doc_start=doc_start, mask=mask)
    q, k_hat, v, bias = leaves
    dense = vq_bidir_attention_naive(q, k_hat, v, bias if with_bias else None, block_len=L, doc_start=doc_start,
                                     mask=mask)
    torch.testing.assert_close(out, dense, rtol=TOL, atol=TOL)
    assert torch.all(out[:, :, 14:20] == 0)
    assert all(torch.isfinite(g).all() for g in gradients(out, leaves, torch.randn_like(out)))
