"""Properties of the VQ operator: linear cost, constant decoding cost, causality, extreme inputs, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from opsutil import make_vq_inputs
from torch.utils.flop_counter import FlopCounterMode

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention, vq_attention_naive


def test_decode_cost_is_independent_of_position():
    """A one-token call does the same arithmetic at position 3L+1 as at position 40L+1: O(S + 2L)."""
    B, H, G, L, S = 1, 1, 1, 8, 16
    T = 40 * L + 2
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=torch.float32)

    def flops_of_token(position):
        _, state = vq_attention(q[:, :, :position], k_hat[:, :, :position], v[:, :, :position],
                                bias[:, :, :position], block_len=L, z=z[:, :, :position], codebook=codebook)
        sl = slice(position, position + 1)
        with FlopCounterMode(display=False) as counter:
            vq_attention(q[:, :, sl], k_hat[:, :, sl], v[:, :, sl], bias[:, :, sl], block_len=L, state=state,
                         z=z[:, :, sl], codebook=codebook)
        return counter.get_total_flops()

    early, late = flops_of_token(3 * L + 1), flops_of_token(40 * L + 1)
    assert early == late > 0
    Dk, Dv = q.shape[-1], v.shape[-1]
    assert late <= 2 * (S + 2 * L) * (Dk + Dv)  # the matmuls of one query against S codes + 2L keys


def test_causality_by_jacobian():
    """d out_t / d x_s is zero for s > t and not all zero for s <= t (x = every input at position s)."""
    B, H, G, T, L, S = 1, 2, 1, 13, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)

    def run(q, k_hat, v, bias):
        return vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)[0]

    jac = torch.autograd.functional.jacobian(run, (q, k_hat, v, bias))
    for name, j in zip(("q", "k_hat", "v", "bias"), jac):
        # j: (B, H, T, Dv, B, heads, T, width) -> dependence of out_t on input position s
        dep = j.abs().sum(dim=(0, 1, 3, 4, 5, 7))  # (T_out, T_in)
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        assert torch.all(dep[future] == 0), f"out_t depends on future {name}"
    dep_v = jac[2].abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(dep_v[~torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)] > 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_keys_same_code_and_empty_cache(reduction):
    B, H, G, T, L, S = 1, 1, 1, 40, 4, 7
    codes = torch.full((B, G, T), 3)
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, codes=codes)
    out, state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, vq_attention_naive(q, k_hat, v, bias, block_len=L), rtol=1e-12, atol=1e-12)
    assert state.cache_count[0, 0].tolist() == [0, 0, 0, T - L - T % L, 0, 0, 0]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_huge_scores_stay_finite(reduction):
    B, H, G, T, L, S = 1, 2, 2, 29, 4, 5
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=torch.float32, scale=1e4)
    q.requires_grad_(True)
    out, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    # Scores of ~1e4 carry float32 rounding of ~1e-3, which decides near-ties of the softmax, so the
    # value check is done in float64, where the scores are exact enough to compare.
    q64, k64, v64, b64, c64 = (x.detach().double() for x in (q, k_hat, v, bias, codebook))
    out64, _ = vq_attention(q64, k64, v64, b64, block_len=L, z=z, codebook=c64, reduction=reduction)
    torch.testing.assert_close(out64, vq_attention_naive(q64, k64, v64, b64, block_len=L), rtol=1e-9, atol=1e-9)


def test_counts_stay_float32_under_autocast():
    B, H, G, T, L, S = 1, 1, 1, 20, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    assert state.cache_count.dtype == torch.float32
    assert state.cache_mean.dtype == torch.float32
    # bf16 matmuls carry ~3 significant digits; the outputs are convex combinations of O(1) values.
    torch.testing.assert_close(out.float(), vq_attention_naive(q, k_hat, v, bias, block_len=L), rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(reduction="scan"), "reduction must be one of serial, matmul, assoc"),
        (dict(block_len=0), "block_len must be a positive integer"),
        (dict(bias_width=3), r"bias must be \[B, H, T, 2L\] = \[1, 2, 5, 8\], got \[1, 2, 5, 3\]"),
        (dict(z_dtype=torch.int32), "z must be int64 shortcodes"),
        (dict(heads=3), "the number of key/value groups G=2 must divide the number of heads H=3"),
        (dict(codebook_groups=1), r"codebook must be \[G, S, Dk\] = \[2, S, 6\], got \[1, 3, 6\]"),
        (dict(z_length=4), r"z must be \[B, G, T\] = \[1, 2, 5\], got \[1, 2, 4\]"),
    ],
)
def test_bad_input_messages(change, message):
    B, H, G, T, L, S = 1, change.get("heads", 2), 2, 5, 4, 3
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, 2, G, T, L, S)
    q = q[:, :1].expand(B, H, T, q.shape[-1]) if "heads" in change else q
    if "bias_width" in change:
        bias = bias[..., :3]
    if "z_dtype" in change:
        z = z.to(change["z_dtype"])
    codebook = codebook[:change.get("codebook_groups", G)]
    z = z[..., :change.get("z_length", T)]
    with pytest.raises(ValueError, match=message):
        vq_attention(q, k_hat, v, bias, block_len=change.get("block_len", L), z=z, codebook=codebook,
                     reduction=change.get("reduction", "serial"))


def test_linear_scaling_of_work():
    """Arithmetic grows linearly with T: 4x the tokens, 4x the FLOPs (within the scan's small extra)."""
    B, H, G, L, S = 1, 1, 1, 16, 16
    counts = []
    for T in (8 * L, 32 * L):
        q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, dtype=torch.float32)
        with FlopCounterMode(display=False) as counter:
            vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction="serial")
        counts.append(counter.get_total_flops())
    assert math.isclose(counts[1] / counts[0], 4.0, rel_tol=0.01)
