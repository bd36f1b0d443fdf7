"""The code-pair table and the lookup of a query's scores: values and gradients against the plain product."""

from __future__ import annotations

import pytest
import torch
from qkutil import make_qk_inputs

from transformer_vq.ops.vq_qk import code_pair_table, lookup_code_scores
from transformer_vq.ops.vq_qk.table import check_query_codes


@pytest.mark.parametrize("heads", [(1, 1), (2, 2), (4, 1), (4, 2)], ids=lambda hg: f"H{hg[0]}-G{hg[1]}")
def test_lookup_equals_the_product_and_its_gradient(heads):
    H, G = heads
    B, T, S_q, S_k = 2, 11, 5, 3
    q_hat, z_q, codebook_q, _, _, codebook, _, _ = make_qk_inputs(B, H, G, T, 4, S_q, S_k)
    table = code_pair_table(codebook_q, codebook)
    assert table.shape == (H, S_q, S_k)
    per_head = codebook.repeat_interleave(H // G, dim=0)  # (H, S_k, Dk): C_K of head h's group
    # float64, one dot product of Dk = 6 terms each, summed in possibly different orders.
    torch.testing.assert_close(table, codebook_q @ per_head.transpose(-1, -2), rtol=1e-12, atol=1e-12)

    q_hat.requires_grad_(True)
    scores = lookup_code_scores(q_hat, z_q, table, codebook)
    product = q_hat @ per_head.transpose(-1, -2).unsqueeze(0)  # (B, H, T, S_k)
    torch.testing.assert_close(scores, product, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(scores.shape, dtype=scores.dtype, generator=torch.Generator().manual_seed(3))
    (got,) = torch.autograd.grad(scores, q_hat, cotangent)
    (want,) = torch.autograd.grad(product, q_hat, cotangent)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_codebooks_get_no_gradient():
    q_hat, z_q, codebook_q, _, _, codebook, _, _ = make_qk_inputs(1, 2, 1, 5, 4, 3, 4)
    for x in (q_hat, codebook_q, codebook):
        x.requires_grad_(True)
    scores = lookup_code_scores(q_hat, z_q, code_pair_table(codebook_q, codebook), codebook)
    grads = torch.autograd.grad(scores.sum(), (q_hat, codebook_q, codebook), allow_unused=True)
    assert grads[0] is not None and grads[1] is None and grads[2] is None


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(codebook_q=(3, 5, 6)), r"codebook_q must be \[H, S_q, Dk\] = \[2, S_q, 6\], got \[3, 5, 6\]"),
        (dict(codebook_q=(2, 5, 4)), r"codebook_q must be \[H, S_q, Dk\] = \[2, S_q, 6\], got \[2, 5, 4\]"),
        (dict(z_q_length=4), r"z_q must be \[B, H, T\] = \[1, 2, 7\], got \[1, 2, 4\]"),
        (dict(z_q_dtype=torch.int32), "z_q must be int64 shortcodes, got torch.int32"),
        (dict(z_q_value=5), r"z_q must lie in \[0, S_q\) = \[0, 5\), got codes from 0 to 5"),
        (dict(z_q_value=-1), r"z_q must lie in \[0, S_q\) = \[0, 5\), got codes from -1 to 4"),
        (dict(table=(2, 5, 4)), r"table must be \[H, S_q, S_k\] = \[2, 5, 3\], got \[2, 5, 4\]"),
    ],
)
def test_bad_query_side_messages(change, message):
    q_hat, z_q, codebook_q, _, _, codebook, _, _ = make_qk_inputs(1, 2, 1, 7, 4, 5, 3)
    z_q[0, 0, :5] = torch.arange(5)  # every code from 0 to 4 occurs
    if "codebook_q" in change:
        codebook_q = torch.zeros(change["codebook_q"], dtype=codebook_q.dtype)
    z_q = z_q[..., :change.get("z_q_length", 7)].to(change.get("z_q_dtype", torch.long))
    if "z_q_value" in change:
        z_q[0, 1, 0] = change["z_q_value"]
    table = torch.zeros(change["table"]) if "table" in change else None
    with pytest.raises(ValueError, match=message):
        check_query_codes(q_hat, z_q, codebook_q, codebook, table)
