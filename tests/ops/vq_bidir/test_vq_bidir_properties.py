"""Properties of the non-causal operator: padding changes nothing for real tokens, fully padded sequences stay finite,
linear cost, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from opsutil import MASK_MUST, host_reads_refused, make_vq_inputs
from torch.utils.flop_counter import FlopCounterMode

from transformer_vq.ops.vq_bidir import SCORINGS, vq_bidir_attention
from transformer_vq.ops.vq_bidir.attention import CORRECTION_LIMIT
from transformer_vq.ops.vq_bidir.window_product import window_product, window_product_naive

WINDOWS = ["nobias", "window"]


def inputs(B, H, G, T, L, S, window, seed=0):
    q, k_hat, z, v, codebook, _ = make_vq_inputs(B, H, G, T, L, S, seed=seed)
    bias = torch.randn(B, H, T, 3 * L, dtype=q.dtype, generator=torch.Generator().manual_seed(seed + 1))
    return q, k_hat, z, v, codebook, bias if window == "window" else None


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_appended_padding_changes_nothing(scoring, window):
    """Random junk appended as padding (3 blocks and a bit) leaves real outputs and their gradients unchanged."""
    B, H, G, T, L, S, extra = 2, 2, 1, 22, 4, 5, 14
    long = inputs(B, H, G, T + extra, L, S, window)
    short = [x[:, :, :T].clone() if x is not None else None for x in long]
    for x in (*long[:2], *short[:2]):
        x.requires_grad_(True)
    mask = torch.arange(T + extra) < T
    kwargs = dict(block_len=L, codebook=long[4], scoring=scoring)
    q, k_hat, z, v, _, bias = long
    padded, _ = vq_bidir_attention(q, k_hat, v, bias, z=z, mask=mask.expand(B, -1), **kwargs)
    q_s, k_s, z_s, v_s, _, bias_s = short
    plain, _ = vq_bidir_attention(q_s, k_s, v_s, bias_s, z=z_s, **kwargs)
    # float64, same codes in the same order: only the rounding of different block layouts differs.
    torch.testing.assert_close(padded[:, :, :T], plain, rtol=1e-12, atol=1e-12)
    assert torch.all(padded[:, :, T:] == 0)
    grads = torch.autograd.grad(padded.sum(), (q, k_hat), allow_unused=True, materialize_grads=True)
    plain_grads = torch.autograd.grad(plain.sum(), (q_s, k_s), allow_unused=True, materialize_grads=True)
    for got, want in zip(grads, plain_grads):
        torch.testing.assert_close(got[:, :, :T], want, rtol=1e-12, atol=1e-12)
        assert torch.all(got[:, :, T:] == 0)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_fully_padded_sequence_is_zero_and_finite(scoring, window):
    """A sequence with no real token: zero outputs, zero (not NaN) gradients; its neighbour in the batch unaffected."""
    B, H, G, T, L, S = 2, 1, 1, 13, 4, 3
    q, k_hat, z, v, codebook, bias = inputs(B, H, G, T, L, S, window)
    q.requires_grad_(True)
    v.requires_grad_(True)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1] = False
    kwargs = dict(block_len=L, codebook=codebook, scoring=scoring)
    out, _ = vq_bidir_attention(q, k_hat, v, bias, z=z, mask=mask, **kwargs)
    assert torch.all(out[1] == 0)
    grad_q, grad_v = torch.autograd.grad(out.sum(), (q, v))
    assert torch.all(grad_q[1] == 0) and torch.all(grad_v[1] == 0)
    alone, _ = vq_bidir_attention(q[:1], k_hat[:1], v[:1], None if bias is None else bias[:1], z=z[:1], **kwargs)
    torch.testing.assert_close(out[:1], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_inference_equals_training_path(scoring, window):
    """Under no_grad the scores are overwritten in place: the same output bit for bit, and the inputs untouched."""
    B, H, G, T, L, S = 2, 2, 1, 19, 4, 5
    q, k_hat, z, v, codebook, bias = inputs(B, H, G, T, L, S, window)
    code_scores = q @ codebook.mT[None]
    before = code_scores.clone()
    kwargs = dict(block_len=L, z=z, codebook=codebook, scoring=scoring, code_scores=code_scores)
    q.requires_grad_(True)
    tracked, _ = vq_bidir_attention(q, k_hat, v, bias, **kwargs)
    with torch.no_grad():
        scratch, _ = vq_bidir_attention(q, k_hat, v, bias, **kwargs)
    assert torch.equal(scratch, tracked.detach())
    assert torch.equal(code_scores, before)


@pytest.mark.parametrize("shift", [None, -10.0])
@pytest.mark.parametrize("window", WINDOWS)
def test_linear_scaling_of_work_and_memory(window, shift):
    """4x the tokens: 4x the FLOPs, and no tensor saved for backward grows like T x T; with the window a correction
    of the one summary (a bias within the correction limit) and with per-block summaries (``shift``: a bias below)."""
    B, H, G, L, S = 1, 1, 1, 8, 16
    flops = []
    for T in (16 * L, 64 * L):
        q, k_hat, z, v, codebook, bias = inputs(B, H, G, T, L, S, window)
        if bias is not None:
            bias = bias.clamp(min=-CORRECTION_LIMIT) if shift is None else bias + shift
        q.requires_grad_(True)
        largest = [0]

        def pack(t):
            largest[0] = max(largest[0], t.numel())
            return t

        with FlopCounterMode(display=False) as counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            vq_bidir_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
        flops.append(counter.get_total_flops())
        # The largest: T x max(S, 3L) scores, or the N x S x Dv block summaries; T x T would be 262144 at T = 512.
        assert largest[0] <= T * max(S, 3 * L, S * v.shape[-1] // L)
    assert math.isclose(flops[1] / flops[0], 4.0, rel_tol=0.01)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(state=object()), "state must be None: non-causal attention reads whole sequences and carries no state"),
        (dict(scoring="relu"), "scoring must be one of softmax, relu2, got 'relu'"),
        (dict(block_len=0), "block_len must be a positive integer"),
        (dict(bias_width=8), r"bias must be \[B, H, T, 3L\] = \[1, 2, 5, 12\], got \[1, 2, 5, 8\]"),
        (dict(z_dtype=torch.int32), "z must be int64 shortcodes"),
        (dict(codebook_groups=1), r"codebook must be \[G, S, Dk\] = \[2, S, 6\], got \[1, 3, 6\]"),
        (dict(mask_length=4), rf"{MASK_MUST} \[1, 5\], got torch.bool \[1, 4\]"),
        (dict(mask_dtype=torch.int64), rf"{MASK_MUST} \[1, 5\], got torch.int64 \[1, 5\]"),
        (dict(code_scores_width=4), r"code_scores must be \[B, H, T, S\] = \[1, 2, 5, 3\], got \[1, 2, 5, 4\]"),
    ],
)
def test_bad_input_messages(change, message):
    B, H, G, T, L, S = 1, 2, 2, 5, 4, 3
    q, k_hat, z, v, codebook, bias = inputs(B, H, G, T, L, S, "window")
    bias = bias[..., :change.get("bias_width", 3 * L)]
    mask = torch.ones(B, change.get("mask_length", T), dtype=change.get("mask_dtype", torch.bool))
    code_scores = torch.zeros(B, H, T, change["code_scores_width"]) if "code_scores_width" in change else None
    with pytest.raises(ValueError, match=message):
        vq_bidir_attention(q, k_hat, v, bias, block_len=change.get("block_len", L), state=change.get("state"),
                           z=z.to(change.get("z_dtype", torch.long)), codebook=codebook[:change.get("codebook_groups")],
                           mask=mask, scoring=change.get("scoring", "softmax"), code_scores=code_scores)


@pytest.mark.parametrize("n_blocks", [1, 2, 5])
def test_window_product_equals_its_padded_twin(n_blocks):
    """Three block products with their own backward against the product with the padded, unfolded values: outputs
    and both gradients, float64 to 1e-12."""
    B, G, t, L, Dv = 2, 2, 6, 3, 4
    gen = torch.Generator().manual_seed(n_blocks)
    weights = torch.randn(B, G, n_blocks, t, 3 * L, dtype=torch.float64, generator=gen, requires_grad=True)
    values = torch.randn(B, G, n_blocks, L, Dv, dtype=torch.float64, generator=gen, requires_grad=True)
    got, want = window_product(weights, values), window_product_naive(weights, values)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    (gw, gv), (ww, wv) = (torch.autograd.grad(y, (weights, values), cotangent) for y in (got, want))
    torch.testing.assert_close(gv, wv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, ww, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_recomputed_softmax_equals_its_autograd_twin(masked):
    """The window softmax under autograd takes ``CorrectedSoftmax`` (scores recomputed in the backward); passing the
    code scores ``q @ C^T`` explicitly takes the autograd path of ``combine_corrected`` instead. Outputs bit for bit,
    the gradients of q, k_hat, v and the bias to 1e-12 (float64), over several blocks, two heads a group, padding."""
    B, H, G, T, L, S = 2, 4, 2, 29, 4, 5
    q, k_hat, z, v, codebook, bias = inputs(B, H, G, T, L, S, "window")
    mask = (torch.rand(B, T, generator=torch.Generator().manual_seed(5)) < 0.8) if masked else None
    leaves = [x.requires_grad_() for x in (q, k_hat, v, bias)]
    kwargs = dict(block_len=L, z=z, codebook=codebook, mask=mask)
    recomputed, _ = vq_bidir_attention(q, k_hat, v, bias, **kwargs)
    explicit = q @ codebook.repeat_interleave(H // G, 0).mT[None]  # (B, H, T, S): head h reads group h // R
    twin, _ = vq_bidir_attention(q, k_hat, v, bias, code_scores=explicit, **kwargs)
    assert torch.equal(recomputed, twin)
    cotangent = torch.randn(twin.shape, dtype=twin.dtype, generator=torch.Generator().manual_seed(6))
    for name, got, want in zip(("q", "k_hat", "v", "bias"), torch.autograd.grad(recomputed, leaves, cotangent),
                               torch.autograd.grad(twin, leaves, cotangent)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("scoring", SCORINGS)
def test_padding_is_zeroed_without_reading_the_mask(scoring, monkeypatch):
    """An encoder's call zeroes its padding queries' rows without asking the host whether the mask holds any (it
    once read ``mask.all()`` at every call: a device sync per layer on a GPU); a mask of all True changes nothing."""
    B, H, G, T, L, S = 2, 2, 1, 22, 4, 5
    q, k_hat, z, v, codebook, _ = inputs(B, H, G, T, L, S, "codes")
    mask = torch.arange(T).expand(B, T) < torch.tensor([[T], [13]])
    kwargs = dict(block_len=L, z=z, codebook=codebook, scoring=scoring)
    plain, _ = vq_bidir_attention(q, k_hat, v, **kwargs)
    with monkeypatch.context() as patch:
        host_reads_refused(patch)
        padded, _ = vq_bidir_attention(q, k_hat, v, mask=mask, **kwargs)
        all_real, _ = vq_bidir_attention(q, k_hat, v, mask=torch.ones(B, T, dtype=torch.bool), **kwargs)
    assert bool((padded[1, :, 13:] == 0).all()) and bool((padded[0] != 0).any())
    torch.testing.assert_close(all_real, plain, rtol=0, atol=0)


@pytest.mark.parametrize("bias", [None, -10.0, -30.0], ids=["summaries", "corrected", "per-block"])
@pytest.mark.parametrize("how", ["float16", "autocast"])
def test_relu2_stays_within_float16_over_thousands_of_keys(how, bias):
    """relu(q . C[s])^2 c[s] of a code with thousands of keys exceeds float16's 65504 long before the output does (a
    mean over keys): with the division by n after the product, 3% of the outputs of unit-scale inputs at 2,048 keys
    were inf or NaN (float16 inputs, or float16 autocast), where the dense formula in float16 stays within 1e-2."""
    from transformer_vq.ops.vq_bidir import vq_bidir_attention_naive

    B, H, G, T, L, S = 1, 1, 1, 2048, 64, 4
    q, k_hat, z, v, codebook, _ = make_vq_inputs(B, H, G, T, L, S, Dk=16, Dv=8, dtype=torch.float32, seed=1)
    beta = None if bias is None else torch.full((B, H, T, 3 * L), bias)
    reference = vq_bidir_attention_naive(*(None if x is None else x.double() for x in (q, k_hat, v, beta)),
                                         block_len=L, scoring="relu2")
    args = (q, k_hat, v, beta)
    if how == "float16":
        args = tuple(None if x is None else x.half() for x in args)
        codebook = codebook.half()
    with torch.autocast("cpu", dtype=torch.float16, enabled=how == "autocast"):
        out, _ = vq_bidir_attention(*args, block_len=L, z=z, codebook=codebook, scoring="relu2")
    assert torch.isfinite(out).all()
    assert (out.double() - reference).abs().max() < 2e-2 * reference.abs().max()
