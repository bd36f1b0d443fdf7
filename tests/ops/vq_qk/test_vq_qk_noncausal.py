"""Non-causal attention with quantized queries: one row per query code equals the dense formula, with and without
padding masks; the straight-through gradient for ``q_hat`` and the gradient for ``v`` equal the formula's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from opsutil import MASK_MUST
from qkutil import make_qk_inputs, qk_grid_id

from transformer_vq.ops.vq_qk import vq_qk_attention_noncausal, vq_qk_attention_noncausal_naive

# (B, H, G, T, L, S_q, S_k): L is unused (no window); T = 1, S_q = 1, S_k = 1, (H, G) in {(1,1), (2,2), (4,1), (4,2)}
GRID = [
    (2, 1, 1, 1, 1, 3, 4),
    (2, 2, 2, 37, 1, 6, 5),
    (1, 4, 1, 50, 1, 1, 1),
    (2, 4, 2, 23, 1, 7, 9),
]
# float64: the per-code sums and the dense ones differ only in summation order, so near machine precision.
TOL = 1e-10


def _mask(B, T, seed):
    """Random padding, with the first sequence whole and the last holding a single real token."""
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.6
    mask[0] = True
    mask[-1] = False
    mask[-1, T // 2] = True
    return mask


def _call(inputs, mask):
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, _ = inputs
    return vq_qk_attention_noncausal(q_hat, k_hat, v, z_q=z_q, codebook_q=codebook_q, z=z, codebook=codebook,
                                     mask=mask)


@pytest.mark.parametrize("masked", [False, True], ids=["whole", "masked"])
@pytest.mark.parametrize("params", GRID, ids=qk_grid_id)
def test_matches_the_dense_formula(params, masked):
    B, H, G, T, _, S_q, S_k = params
    inputs = make_qk_inputs(B, H, G, T, 1, S_q, S_k)
    q_hat, _, _, k_hat, _, _, v, _ = inputs
    mask = _mask(B, T, 7) if masked else None
    dense = vq_qk_attention_noncausal_naive(q_hat, k_hat, v, mask=mask)
    per_code = _call(inputs, mask)  # no gradient needed: one row per query code, gathered
    torch.testing.assert_close(per_code, dense, rtol=TOL, atol=TOL)

    q_hat.requires_grad_(True)
    v.requires_grad_(True)
    per_token = _call(inputs, mask)  # q_hat needs a gradient: the rows are looked up per token
    torch.testing.assert_close(per_token, dense, rtol=TOL, atol=TOL)
    dense = vq_qk_attention_noncausal_naive(q_hat, k_hat, v, mask=mask)
    weight = torch.randn(dense.shape, dtype=dense.dtype, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((per_token * weight).sum(), (q_hat, v))
    want = torch.autograd.grad((dense * weight).sum(), (q_hat, v))
    for name, got, expected in zip(("q_hat", "v"), grads, want):
        torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL, msg=f"gradient w.r.t. {name}")


def test_padding_changes_nothing_for_real_tokens():
    """What padded positions hold (codes, values) leaves real outputs unchanged; padded outputs are zero."""
    B, H, G, T, S_q, S_k = 2, 2, 1, 19, 4, 5
    inputs = make_qk_inputs(B, H, G, T, 1, S_q, S_k)
    mask = _mask(B, T, 3)
    out = _call(inputs, mask)
    other = list(make_qk_inputs(B, H, G, T, 1, S_q, S_k, seed=9))
    for i in (0, 1, 3, 4, 6):  # q_hat, z_q, k_hat, z, v differ at padded positions only; the codebooks are shared
        pad = ~mask.view(B, 1, T, *[1] * (inputs[i].dim() - 3))
        other[i] = torch.where(pad, other[i], inputs[i])
    other[2], other[5] = inputs[2], inputs[5]
    other_out = _call(other, mask)
    torch.testing.assert_close(other_out, out, rtol=1e-12, atol=1e-12)
    assert torch.all(out[~mask[:, None, :].expand(B, H, T)] == 0)


def test_keys_and_codebooks_get_no_gradient():
    """Every key is attended through its code: like keys outside the causal window, they get no gradient."""
    inputs = make_qk_inputs(1, 2, 1, 9, 1, 3, 4)
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, _ = inputs
    for x in (q_hat, codebook_q, k_hat, codebook):
        x.requires_grad_(True)
    out = _call(inputs, None)
    grads = torch.autograd.grad(out.sum(), (q_hat, codebook_q, k_hat, codebook), allow_unused=True)
    assert grads[0] is not None and all(g is None for g in grads[1:])


def test_work_per_token_is_independent_of_length():
    """Without gradients the matmul work is the S_q x S_k x Dv of the rows, whatever T."""
    B, H, G, S_q, S_k, Dv = 1, 2, 1, 8, 16, 7
    counts = []
    for T in (64, 1024):
        inputs = make_qk_inputs(B, H, G, T, 1, S_q, S_k, Dv=Dv, dtype=torch.float32)
        with FlopCounterMode(display=False) as counter:
            _call(inputs, None)
        counts.append(counter.get_total_flops())
    # The table (2 H S_q S_k Dk) and the rows (2 B H S_q S_k Dv); the gather and summaries are not matmuls.
    assert counts[0] == counts[1] == 2 * H * S_q * S_k * 6 + 2 * B * H * S_q * S_k * Dv


@pytest.mark.parametrize("defect, message", [
    ("mask_shape", rf"{MASK_MUST} \[1, 9\], got torch.bool \[1, 8\]"),
    ("mask_dtype", rf"{MASK_MUST} \[1, 9\], got torch.int64 \[1, 9\]"),
    ("keys", r"k_hat must be \[B, G, T, Dk\] = \[1, G, 9, 6\], got \[1, 1, 8, 6\]"),
    ("values", r"v must be \[B, G, T, Dv\] with B, G, T of k_hat \[1, 1, 9\], got \[1, 1, 8, 7\]"),
    ("queries", r"q_hat must hold at least one position \(T >= 1\)"),
    ("z_q", r"z_q must be \[B, H, T\] = \[1, 2, 9\], got \[1, 1, 9\]"),
])
def test_bad_inputs_are_named(defect, message):
    q_hat, z_q, codebook_q, k_hat, z, codebook, v, _ = make_qk_inputs(1, 2, 1, 9, 1, 3, 4)
    mask = {"mask_shape": torch.ones(1, 8, dtype=torch.bool), "mask_dtype": torch.ones(1, 9, dtype=torch.long)}
    k_hat = k_hat[:, :, :8] if defect == "keys" else k_hat
    v = v[:, :, :8] if defect == "values" else v
    if defect == "queries":  # no position at all
        q_hat, k_hat, v, z, z_q = (x[:, :, :0] for x in (q_hat, k_hat, v, z, z_q))
    z_q = z_q[:, :1] if defect == "z_q" else z_q
    with pytest.raises(ValueError, match=message):
        vq_qk_attention_noncausal(q_hat, k_hat, v, z_q=z_q, codebook_q=codebook_q, z=z, codebook=codebook,
                                  mask=mask.get(defect))
