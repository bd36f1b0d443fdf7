"""Causal attention with quantized queries: equal to the key-only operator on ``q_hat`` and to the dense formula.

Outputs, states (whole calls, arbitrary splits, one token per call) and gradients, for every reduction.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from opsutil import DOC_STARTS, assert_same_state, doc_start_mask
from qkutil import make_qk_inputs, qk_grid_id

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq_qk import code_pair_table, vq_qk_attention, vq_qk_attention_naive

# (B, H, G, T, L, S_q, S_k): T < L, T = 1, T not a multiple of L, S_q = 1, S_k = 1, (H, G) in {(1,1), (2,2), (4,1)}
GRID = [
    (2, 1, 1, 5, 8, 3, 4),
    (1, 1, 1, 1, 4, 2, 3),
    (2, 2, 2, 37, 8, 6, 5),
    (1, 4, 1, 50, 4, 1, 1),
    (1, 2, 2, 63, 16, 7, 9),
    (2, 4, 1, 17, 4, 3, 2),
]
# float64: the table's dot products and the kernel's differ only in summation order, so near machine precision.
TOL = 1e-10


def _operators(inputs, L, reduction):
    """``(out, state)`` of the Q+K operator, of the key-only operator on ``q_hat``, and the dense formula."""
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias = inputs
    qk = vq_qk_attention(q_hat, k_hat, v, bias, block_len=L, z_q=z_q, codebook_q=codebook_q, z=z,
                         codebook=codebook, reduction=reduction)
    key_only = vq_attention(q_hat, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    return qk, key_only, vq_qk_attention_naive(q_hat, k_hat, v, bias, block_len=L)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("params", GRID, ids=qk_grid_id)
def test_outputs_states_and_gradients(params, reduction):
    B, H, G, T, L, S_q, S_k = params
    inputs = make_qk_inputs(B, H, G, T, L, S_q, S_k)
    q_hat, _, _, k_hat, _, _, v, bias = inputs
    for x in (q_hat, k_hat, v, bias):
        x.requires_grad_(True)
    (out, state), (key_only, key_only_state), dense = _operators(inputs, L, reduction)
    assert out.shape == (B, H, T, v.shape[-1]) and state.offset == T
    torch.testing.assert_close(out, key_only, rtol=TOL, atol=TOL)
    torch.testing.assert_close(out, dense, rtol=TOL, atol=TOL)
    assert_same_state(state, key_only_state, TOL)

    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    wrt = (q_hat, k_hat, v, bias)
    grads = torch.autograd.grad((out * weight).sum(), wrt)
    key_only_grads = torch.autograd.grad((key_only * weight).sum(), wrt)
    for name, got, want in zip(("q_hat", "k_hat", "v", "bias"), grads, key_only_grads):
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=f"gradient w.r.t. {name} (key-only)")
    # The dense formula's gradients for q_hat, v and bias (k_hat's is truncated to the window, as key-only).
    dense_grads = torch.autograd.grad((dense * weight).sum(), (q_hat, v, bias))
    for name, got, want in zip(("q_hat", "v", "bias"), (grads[0], grads[2], grads[3]), dense_grads):
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=f"gradient w.r.t. {name} (dense)")


def _in_pieces(inputs, bounds, L, reduction, table):
    """One call per piece ``[a, b)`` of ``bounds``, the state carried; the outputs concatenated and the last state."""
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias = inputs
    state, pieces = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, state = vq_qk_attention(q_hat[:, :, a:b], k_hat[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], block_len=L,
                                     state=state, z_q=z_q[:, :, a:b], codebook_q=codebook_q, z=z[:, :, a:b],
                                     codebook=codebook, reduction=reduction, table=table)
        pieces.append(out)
        assert state.recent_k.shape[2] <= 2 * L - 1  # constant-size state: nothing grows with position
    return torch.cat(pieces, dim=2), state


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed", range(3))
def test_split_calls_and_single_token_decoding(seed, reduction):
    """Random cuts, then one token per call with the table computed once: the outputs and state of one call."""
    B, H, G, T, L, S_q, S_k = 2, 4, 2, 45, 8, 5, 6
    inputs = make_qk_inputs(B, H, G, T, L, S_q, S_k, seed=seed)
    (whole, whole_state), _, dense = _operators(inputs, L, reduction)
    gen = torch.Generator().manual_seed(100 + seed)
    cuts = sorted(set(torch.randint(1, T, (5,), generator=gen).tolist()))
    table = code_pair_table(inputs[2], inputs[5])
    for bounds, held_table in (([0, *cuts, T], None), (list(range(T + 1)), table)):
        pieces, state = _in_pieces(inputs, bounds, L, reduction, held_table)
        torch.testing.assert_close(pieces, whole, rtol=TOL, atol=TOL)
        torch.testing.assert_close(pieces, dense, rtol=TOL, atol=TOL)
        assert_same_state(state, whole_state, TOL)


def test_float32_close_to_float64():
    inputs = make_qk_inputs(2, 4, 1, 37, 4, 6, 5, dtype=torch.float32)
    (out, _), _, _ = _operators(inputs, 4, "serial")
    dense = vq_qk_attention_naive(*(inputs[i].double() for i in (0, 3, 6, 7)), block_len=4)
    # float32 carries ~7 digits; sums of ~40 terms of size O(10) lose about two more.
    torch.testing.assert_close(out.double(), dense, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("defect, message", [
    ("z_q", r"z_q must lie in \[0, S_q\) = \[0, 3\), got codes from 0 to 3"),
    ("codebook_q", r"codebook_q must be \[H, S_q, Dk\] = \[2, S_q, 6\], got \[2, 3, 5\]"),
    ("z", "z must be int64 shortcodes, got torch.int32"),
    ("bias", r"bias must be \[B, H, T, 2L\] = \[1, 2, 9, 8\], got \[1, 2, 9, 3\]"),
])
def test_bad_inputs_are_named(defect, message):
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias = make_qk_inputs(1, 2, 1, 9, 4, 3, 4)
    if defect == "z_q":
        z_q = z_q.clone().fill_(3)
        z_q[0, 0, 0] = 0
    elif defect == "codebook_q":
        codebook_q = codebook_q[..., :5]
    elif defect == "z":
        z = z.int()
    else:
        bias = bias[..., :3]
    with pytest.raises(ValueError, match=message):
        vq_qk_attention(q_hat, k_hat, v, bias, block_len=4, z_q=z_q, codebook_q=codebook_q, z=z, codebook=codebook)


def test_table_scores_save_the_codebook_product():
    """With the table held, the only arithmetic saved is the 2 B H T S_k Dk of ``q_hat @ C_K^T``: nothing else."""
    B, H, G, T, L, S_q, S_k, Dk = 1, 2, 1, 32, 8, 4, 16, 6
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias = make_qk_inputs(B, H, G, T, L, S_q, S_k, Dk=Dk)
    table = code_pair_table(codebook_q, codebook)
    flops = []
    for call in (lambda: vq_attention(q_hat, k_hat, v, bias, block_len=L, z=z, codebook=codebook),
                 lambda: vq_qk_attention(q_hat, k_hat, v, bias, block_len=L, z_q=z_q, codebook_q=codebook_q, z=z,
                                         codebook=codebook, table=table)):
        with FlopCounterMode(display=False) as counter:
            call()
        flops.append(counter.get_total_flops())
    assert flops[0] - flops[1] == 2 * B * H * T * S_k * Dk


def test_code_scores_of_the_wrong_shape_are_named():
    q_hat, _, _, k_hat, z, codebook, v, bias = make_qk_inputs(1, 2, 1, 9, 4, 3, 4)
    with pytest.raises(ValueError, match=r"code_scores must be \[B, H, T, S\] = \[1, 2, 9, 4\], got \[1, 2, 9, 3\]"):
        vq_attention(q_hat, k_hat, v, bias, block_len=4, z=z, codebook=codebook, code_scores=torch.zeros(1, 2, 9, 3))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_packed_documents_equal_the_key_only_operator_and_the_masked_formula(reduction):
    """Packed documents: the Q+K operator is the key-only one on ``q_hat`` (documents tested there), outputs and every
    gradient, and equals the dense formula with the same-document mask."""
    B, H, G, T, L, S_q, S_k = 2, 4, 2, 37, 4, 3, 5
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias = make_qk_inputs(B, H, G, T, L, S_q, S_k, seed=7)
    wrt = [x.requires_grad_() for x in (q_hat, k_hat, v, bias)]
    doc_start = doc_start_mask(DOC_STARTS, T)
    out, state = vq_qk_attention(q_hat, k_hat, v, bias, block_len=L, z_q=z_q, codebook_q=codebook_q, z=z,
                                 codebook=codebook, reduction=reduction, doc_start=doc_start)
    key_only, key_only_state = vq_attention(q_hat, k_hat, v, bias, block_len=L, z=z, codebook=codebook,
                                            reduction=reduction, doc_start=doc_start)
    torch.testing.assert_close(out, key_only, rtol=TOL, atol=TOL)
    torch.testing.assert_close(out, vq_qk_attention_naive(q_hat, k_hat, v, bias, block_len=L, doc_start=doc_start),
                               rtol=TOL, atol=TOL)
    assert_same_state(state, key_only_state, TOL)
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    for name, got, want in zip(("q_hat", "k_hat", "v", "bias"), torch.autograd.grad((out * weight).sum(), wrt),
                               torch.autograd.grad((key_only * weight).sum(), wrt)):
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=f"gradient w.r.t. {name}")
