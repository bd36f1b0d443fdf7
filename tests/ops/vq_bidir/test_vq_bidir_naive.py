"""The non-causal operator against its dense oracle: outputs and gradients, at awkward sizes, both scorings, without
and with the three-block bias, with and without padding masks; and the ``code_scores`` option."""

from __future__ import annotations

import pytest
import torch
from opsutil import VQ_GRID, make_vq_inputs, vq_grid_id as grid_id

from transformer_vq.ops.vq_bidir import SCORINGS, vq_bidir_attention, vq_bidir_attention_naive
from transformer_vq.ops.vq_bidir import attention as attention_module
from transformer_vq.ops.vq_bidir.attention import codeword_scores
from transformer_vq.ops.vq_bidir.scoring import combine_corrected
from transformer_vq.ops.vq_bidir.naive import dense_attention

# The VQ grid, T = 3L (the first and last windows overlap the whole sequence), and T <= 2L (every window is the
# whole sequence: the operator's dense path), placed first so that the gradient tests below take them too.
GRID = [(2, 2, 1, 16, 8, 4), (1, 1, 1, 13, 8, 3), *VQ_GRID, (2, 1, 1, 12, 4, 3)]
WINDOWS = ["nobias", "window"]
MASKS = ["nomask", "padded"]


def bidir_inputs(params, window, masked, dtype=torch.float64, seed=0):
    """``q, k_hat, z, v, codebook, bias, mask``: ``bias [B, H, T, 3L]`` or None, ``mask`` or None.

    The padded mask gives sequence 0 a tail of padding (whole padded blocks when T >= 4L) and sequence 1 scattered
    holes; every sequence keeps at least one real key.
    """
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, _ = make_vq_inputs(B, H, G, T, L, S, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    bias = torch.randn(B, H, T, 3 * L, generator=gen, dtype=dtype) if window == "window" else None
    mask = None
    if masked == "padded":
        mask = torch.rand(B, T, generator=gen) < 0.7
        mask[0] = torch.arange(T) < max(1, T // 2 - 3)
        mask[:, 0] = True
    return q, k_hat, z, v, codebook, bias, mask


# float64: only the summation order differs, so near machine precision. float32: each path rounds ~1e-7 relative per
# term, summed over O(T + S) terms of size O(10) (relu2 squares scores of a few units): 5e-6 at worst on this grid.
PRECISIONS = {"float64": (torch.float64, 1e-10), "float32": (torch.float32, 5e-5)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("masked", MASKS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("params", GRID, ids=grid_id)
def test_matches_naive(params, scoring, window, masked, precision):
    dtype, tol = PRECISIONS[precision]
    q, k_hat, z, v, codebook, bias, mask = bidir_inputs(params, window, masked, dtype=dtype)
    L = params[4]
    out, state = vq_bidir_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, mask=mask,
                                    scoring=scoring)
    assert state is None
    assert out.shape == (*q.shape[:3], v.shape[-1]) and out.dtype == dtype
    ref = vq_bidir_attention_naive(*(x.double() if x is not None else None for x in (q, k_hat, v, bias)),
                                   block_len=L, mask=mask, scoring=scoring)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if mask is not None:
        assert torch.all(out.transpose(1, 2)[~mask] == 0)  # padding queries: exactly zero


def in_window(length, block_len):
    """``[T, T]`` True where key ``p`` lies in the three-block window of query ``t``."""
    pos = torch.arange(length)
    start = (pos // block_len - 1) * block_len
    return (pos[None, :] >= start[:, None]) & (pos[None, :] < start[:, None] + 3 * block_len)


@pytest.mark.parametrize("masked", MASKS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("params", GRID[:8], ids=grid_id)
def test_gradients_match_naive(params, scoring, window, masked):
    """d/dq, d/dv, d/dbias equal the dense formula's; d/dk_hat equals it with keys outside the window detached."""
    q, k_hat, z, v, codebook, bias, mask = bidir_inputs(params, window, masked)
    L, H = params[4], params[1]
    inputs = [x.requires_grad_() for x in (q, k_hat, v, bias) if x is not None]
    out, _ = vq_bidir_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, mask=mask, scoring=scoring)
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True, materialize_grads=True)

    k_rep = k_hat.repeat_interleave(H // k_hat.shape[1], dim=1)
    live, frozen = q @ k_rep.transpose(-1, -2), q @ k_rep.detach().transpose(-1, -2)
    # Without a bias every key is seen through its code, so no key gradient at all.
    near = in_window(q.shape[2], L) if bias is not None else torch.zeros(q.shape[2], q.shape[2], dtype=torch.bool)
    truncated = dense_attention(torch.where(near, live, frozen), v, bias, block_len=L, mask=mask, scoring=scoring)
    want = torch.autograd.grad((truncated * weight).sum(), inputs, allow_unused=True, materialize_grads=True)
    exact = vq_bidir_attention_naive(q, k_hat, v, bias, block_len=L, mask=mask, scoring=scoring)
    exact_grads = torch.autograd.grad((exact * weight).sum(), inputs)
    for name, got, ref, plain in zip(("q", "k_hat", "v", "bias"), grads, want, exact_grads):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name}")
        if name != "k_hat":  # the truncation touches keys only
            torch.testing.assert_close(got, plain, rtol=1e-10, atol=1e-10, msg=f"gradient w.r.t. {name} (exact)")


def test_key_gradient_is_truncated_outside_window():
    """The documented approximation, stated as a fact: only window keys get a gradient, the exact one has more."""
    params = (1, 1, 1, 24, 4, 3)
    q, k_hat, z, v, codebook, bias, _ = bidir_inputs(params, "window", "nomask")
    k_hat.requires_grad_(True)
    out, _ = vq_bidir_attention(q, k_hat, v, bias, block_len=4, z=z, codebook=codebook)
    (grad,) = torch.autograd.grad(out[:, :, 10].sum(), k_hat)  # query 10: block 2, window = positions 4 .. 15
    assert torch.all(grad[:, :, :4] == 0) and torch.all(grad[:, :, 16:] == 0)
    assert torch.all(grad[:, :, 4:16].abs().sum(-1) > 0)
    (exact,) = torch.autograd.grad(vq_bidir_attention_naive(q, k_hat, v, bias, block_len=4)[:, :, 10].sum(), k_hat)
    assert torch.all(exact[:, :, 16:].abs().sum(-1) > 0)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_explicit_code_scores_equal_default(scoring, window):
    """Passing ``q @ C^T`` as ``code_scores`` gives the default's output bit for bit, and the same q-gradient."""
    params = (2, 4, 2, 21, 4, 5)
    q, k_hat, z, v, codebook, bias, mask = bidir_inputs(params, window, "padded")
    q.requires_grad_(True)
    kwargs = dict(block_len=4, z=z, codebook=codebook, mask=mask, scoring=scoring)
    explicit = q @ codebook.repeat_interleave(2, 0).mT[None]  # (B, H, T, S): head h reads group h // 2
    default, _ = vq_bidir_attention(q, k_hat, v, bias, **kwargs)
    given, _ = vq_bidir_attention(q, k_hat, v, bias, code_scores=explicit, **kwargs)
    torch.testing.assert_close(given, default, rtol=0, atol=0)
    (grad_default,) = torch.autograd.grad(default.sum(), q)
    (grad_given,) = torch.autograd.grad(given.sum(), q)
    torch.testing.assert_close(grad_given, grad_default, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(codeword_scores(q, codebook), explicit, rtol=0, atol=0)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scoring", SCORINGS)
def test_code_scores_from_a_code_pair_table(scoring, window):
    """Quantized queries ``q = C_Q[z_q]``: scores looked up in the ``C_Q C_K^T`` table give the dense formula.

    The window keys are still scored by ``q . k_hat``; only the codeword scores come from the table.
    """
    B, H, G, T, L, S = 2, 2, 1, 30, 4, 6
    _, k_hat, z, v, codebook, bias, mask = bidir_inputs((B, H, G, T, L, S), window, "padded")
    gen = torch.Generator().manual_seed(5)
    query_codebook = torch.randn(7, 6, generator=gen, dtype=torch.float64)  # S_q = 7 query codes, Dk = 6
    z_q = torch.randint(0, 7, (B, H, T), generator=gen)
    q = query_codebook[z_q]  # (B, H, T, Dk)
    table = query_codebook @ codebook[0].T  # (S_q, S): every code pair's score
    out, _ = vq_bidir_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, mask=mask, scoring=scoring,
                                code_scores=table[z_q])
    ref = vq_bidir_attention_naive(q, k_hat, v, bias, block_len=L, mask=mask, scoring=scoring)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("level", [-30.0, -8.0, -3.5, 4.0])
@pytest.mark.parametrize("sharpness", [1.0, 30.0])
@pytest.mark.parametrize("scoring", SCORINGS)
def test_float32_with_a_strong_window_bias(scoring, level, sharpness, monkeypatch):
    """The window's keys are corrected from their code's weight over the whole sequence
    (``scoring.combine_corrected``) while no bias is below ``-CORRECTION_LIMIT``: a negative bias subtracts part of
    that weight again, at most all but ``e^-4`` of it. Below, the per-block summaries (only additions). Either way
    float32 stays within 1e-5 of the float64 dense formula, relative to the output's scale, also with sharp queries
    (scores x 30), where a correction at -30 measured 80% off; a positive bias only adds."""
    params = (2, 2, 1, 96, 8, 6)
    q, k_hat, z, v, codebook, bias, mask = bidir_inputs(params, "window", "padded", dtype=torch.float32)
    q, bias = q * sharpness, 0.5 * bias + level
    corrected = []
    monkeypatch.setattr(attention_module, "combine_corrected",
                        lambda *a, **k: corrected.append(1) or combine_corrected(*a, **k))
    out, _ = vq_bidir_attention(q, k_hat, v, bias, block_len=8, z=z, codebook=codebook, mask=mask, scoring=scoring)
    ref = vq_bidir_attention_naive(*(x.double() for x in (q, k_hat, v, bias)), block_len=8, mask=mask,
                                   scoring=scoring)
    scale = ref.abs().max().item()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * scale)
    assert bool(corrected) == (float(bias.min()) >= -attention_module.CORRECTION_LIMIT)
