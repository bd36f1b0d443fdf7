"""Packed documents through the VQ operator: each document gets exactly what it gets alone.

"Alone" is the document run by itself from an empty state at the position where it sits in the row (its block grid
is the row's); a document that starts on a block edge therefore also equals the document run from position 0. The
operator is held to the dense formula with a same-document mask (outputs; gradients of q, v, bias), to the
block-by-block oracle (every gradient, final state), and to the documents run one by one (everything), in float64.
"""

from __future__ import annotations

import pytest
import torch
from opsutil import DOC_STARTS, assert_same_state, doc_start_mask, documents, make_vq_inputs

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import VQAttentionState, vq_attention, vq_attention_blockwise, vq_attention_naive

TOL = 1e-12  # float64: only the summation order differs from the references
B, H, G, T, L, S = 2, 4, 2, 37, 4, 5
NAMES = ("q", "k_hat", "v", "bias")


def packed_inputs(seed=0, n_head=H, n_group=G):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, n_head, n_group, T, L, S, seed=seed)
    return [x.requires_grad_() for x in (q, k_hat, v, bias)], z, codebook


def gradients(out, leaves, cotangent):
    return torch.autograd.grad(out, leaves, cotangent)


def assert_all_close(got, want, names=NAMES):
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m: f"{name}: {m}")


def run_documents_alone(leaves, z, codebook, doc_start, **options):
    """Each document of each row by itself, from an empty state at its position: outputs laid back in place."""
    q, k_hat, v, bias = leaves
    rows = [[] for _ in range(B)]
    for row, a, b in documents(doc_start):
        empty = VQAttentionState.empty(1, k_hat.shape[1], S, k_hat.shape[-1], v.shape[-1], dtype=v.dtype, offset=a)
        piece = (slice(row, row + 1), slice(None), slice(a, b))
        out, _ = vq_attention(q[piece], k_hat[piece], v[piece], bias[piece], block_len=L, z=z[piece],
                              codebook=codebook, state=empty, **options)
        rows[row].append(out)
    return torch.cat([torch.cat(r, dim=2) for r in rows], dim=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_packed_matches_the_masked_formula_and_the_block_loop(reduction):
    leaves, z, codebook = packed_inputs()
    doc_start = doc_start_mask(DOC_STARTS, T)
    out, state = vq_attention(*leaves, block_len=L, z=z, codebook=codebook, reduction=reduction, doc_start=doc_start)
    dense = vq_attention_naive(*leaves, block_len=L, doc_start=doc_start)
    blockwise, blockwise_state = vq_attention_blockwise(*leaves, block_len=L, z=z, codebook=codebook,
                                                        doc_start=doc_start)
    torch.testing.assert_close(out, dense, rtol=TOL, atol=TOL)
    torch.testing.assert_close(out, blockwise, rtol=TOL, atol=TOL)
    assert_same_state(state, blockwise_state, TOL)
    assert torch.equal(state.recent_start, blockwise_state.recent_start)
    cotangent = torch.randn_like(out)
    got = gradients(out, leaves, cotangent)
    assert_all_close(got, gradients(blockwise, leaves, cotangent))
    # The dense formula gives every key its gradient; the operator only window keys (docs/operator.md).
    dense_grads = gradients(dense, leaves, cotangent)
    assert_all_close([got[0], got[2], got[3]], [dense_grads[0], dense_grads[2], dense_grads[3]], ("q", "v", "bias"))


@pytest.mark.parametrize("heads", [(1, 1), (2, 2), (4, 1)], ids=["gau", "mha", "mqa"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compressive_cache", [True, False], ids=["cache", "window"])
def test_packed_equals_each_document_alone(reduction, compressive_cache, heads):
    leaves, z, codebook = packed_inputs(seed=1, n_head=heads[0], n_group=heads[1])
    doc_start = doc_start_mask(DOC_STARTS, T)
    options = {"reduction": reduction, "compressive_cache": compressive_cache}
    out, _ = vq_attention(*leaves, block_len=L, z=z, codebook=codebook, doc_start=doc_start, **options)
    alone = run_documents_alone(leaves, z, codebook, doc_start, **options)
    torch.testing.assert_close(out, alone, rtol=TOL, atol=TOL)
    cotangent = torch.randn_like(out)
    assert_all_close(gradients(out, leaves, cotangent), gradients(alone, leaves, cotangent))


def test_a_document_starting_on_a_block_edge_equals_it_from_position_zero():
    """The window bias of query ``tau`` depends on ``tau mod L`` only, so a document starting at a multiple of ``L``
    is the sequence it would be alone."""
    leaves, z, codebook = packed_inputs(seed=2)
    doc_start = doc_start_mask(DOC_STARTS, T)
    out, _ = vq_attention(*leaves, block_len=L, z=z, codebook=codebook, doc_start=doc_start)
    q, k_hat, v, bias = leaves
    for row, a, b in documents(doc_start):
        if a % L:
            continue
        piece = (slice(row, row + 1), slice(None), slice(a, b))
        alone, _ = vq_attention(q[piece], k_hat[piece], v[piece], bias[piece], block_len=L, z=z[piece],
                                codebook=codebook)
        torch.testing.assert_close(out[piece], alone, rtol=TOL, atol=TOL, msg=lambda m: f"row {row} [{a}, {b}): {m}")


@pytest.mark.parametrize("bounds", [[0, 2, 5, 13, 14, 26, 37], [0, 8, 24, 37], list(range(T + 1))],
                         ids=["mid-block", "block-edges", "one-token"])
def test_state_carried_across_boundaries_equals_one_call(bounds):
    """Truncated backprop through time: pieces with the state carried (a document running from one piece into the
    next, documents beginning inside pieces) equal one call, outputs and gradients. The starts are given to the piece
    holding them only: an earlier document stays apart through the state."""
    leaves, z, codebook = packed_inputs(seed=3)
    doc_start = doc_start_mask(DOC_STARTS, T)
    whole, whole_state = vq_attention(*leaves, block_len=L, z=z, codebook=codebook, doc_start=doc_start)
    state, pieces = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        starts = doc_start[:, a:b]
        out, state = vq_attention(*(x[:, :, a:b] for x in leaves), block_len=L, z=z[:, :, a:b], codebook=codebook,
                                  state=state, doc_start=starts if bool(starts.any()) else None)
        pieces.append(out)
    pieces = torch.cat(pieces, dim=2)
    torch.testing.assert_close(pieces, whole, rtol=TOL, atol=TOL)
    assert_same_state(state, whole_state, TOL)
    cotangent = torch.randn_like(whole)
    assert_all_close(gradients(pieces, leaves, cotangent), gradients(whole, leaves, cotangent))


def test_no_starts_is_the_unpacked_operator():
    leaves, z, codebook = packed_inputs(seed=4)
    unpacked, _ = vq_attention(*leaves, block_len=L, z=z, codebook=codebook)
    first_only = doc_start_mask(([0], [0]), T)
    packed, _ = vq_attention(*leaves, block_len=L, z=z, codebook=codebook, doc_start=first_only)
    torch.testing.assert_close(packed, unpacked, rtol=TOL, atol=TOL)


def test_bad_doc_start_is_refused():
    leaves, z, codebook = packed_inputs()
    with pytest.raises(ValueError, match=r"^doc_start must be a \[B, T\] = \[2, 37\] bool tensor, got \[2, 36\] "
                                         r"torch.bool$"):
        vq_attention(*leaves, block_len=L, z=z, codebook=codebook, doc_start=torch.zeros(B, T - 1, dtype=torch.bool))
