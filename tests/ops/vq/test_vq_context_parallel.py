"""Context parallelism simulated in one process: R chunks, each attending from the state composed of the summaries of
the chunks before it, give the single call's outputs, gradients and final state (float64, to rounding)."""

from __future__ import annotations

import pytest
import torch
from opsutil import assert_same_state, make_vq_inputs

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq.context_parallel import (chunk_summary, compose, vq_attention_context_parallel,
                                                    vq_attention_context_parallel_reference)

# (B, H, G, T, L, S, R): one block per rank, several blocks, multi-query, R = 1 (the plain call), S = 1
CASES = [
    (2, 1, 1, 16, 8, 4, 2),
    (1, 2, 2, 48, 4, 5, 4),
    (2, 4, 1, 36, 4, 3, 3),
    (1, 1, 1, 24, 4, 1, 2),
    (2, 2, 1, 32, 8, 6, 1),
    (1, 2, 2, 64, 4, 7, 8),
]


def case_id(case):
    return "B{}-H{}-G{}-T{}-L{}-S{}-R{}".format(*case)


def whole_and_split(case, reduction, prefix):
    """Outputs and gradients of the plain call and of the simulated ranks, on ``T`` tokens after ``prefix`` tokens
    consumed by an earlier call (whose state both start from)."""
    B, H, G, T, L, S, R = case
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, prefix + T, L, S, seed=T + R)
    state = None
    if prefix:
        _, state = vq_attention(q[:, :, :prefix], k_hat[:, :, :prefix], v[:, :, :prefix], bias[:, :, :prefix],
                                block_len=L, z=z[:, :, :prefix], codebook=codebook)
    tail = [t[:, :, prefix:].clone().requires_grad_(t.is_floating_point()) for t in (q, k_hat, v, bias, z)]
    q, k_hat, v, bias, z = tail
    results = []
    for run in (lambda: vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, state=state,
                                     reduction=reduction),
                lambda: vq_attention_context_parallel_reference(q, k_hat, v, bias, block_len=L, ranks=R, z=z,
                                                                codebook=codebook, state=state, reduction=reduction)):
        out, final = run()
        cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads = torch.autograd.grad(out, (q, k_hat, v, bias), cotangent)
        results.append((out, final, grads))
    return results


@pytest.mark.parametrize("prefix", [0, 8, 24], ids=lambda p: f"after{p}")
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_simulated_ranks_equal_one_call(case, reduction, prefix):
    (out, final, grads), (cp_out, cp_final, cp_grads) = whole_and_split(case, reduction, prefix)
    # float64: the merges run in another order, so the results differ by rounding only (~1e-16 relative)
    torch.testing.assert_close(cp_out, out, rtol=1e-12, atol=1e-12)
    for name, got, want in zip(("q", "k_hat", "v", "bias"), cp_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"grad {name}: {m}")
    assert_same_state(cp_final, final, 1e-12)


def test_float32_to_rounding():
    B, H, G, T, L, S, R = 2, 2, 1, 64, 8, 5, 4
    q, k_hat, z, v, codebook, bias = (t.float() if t.is_floating_point() else t
                                      for t in make_vq_inputs(B, H, G, T, L, S))
    out, final = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    cp_out, cp_final = vq_attention_context_parallel_reference(q, k_hat, v, bias, block_len=L, ranks=R, z=z,
                                                               codebook=codebook)
    # float32 carries ~7 digits; a softmax over ~S + 2L terms of size O(10) loses about one more
    torch.testing.assert_close(cp_out, out, rtol=1e-5, atol=1e-5)
    assert_same_state(cp_final, final, 1e-6)


def test_summary_is_the_state_from_nothing():
    """A chunk's summary is what the operator ends with when it starts the chunk with an empty state."""
    B, H, G, T, L, S = 2, 2, 2, 40, 8, 5
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    _, final = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    summary = chunk_summary(k_hat, v, z, block_len=L, n_code=S, acc_dtype=torch.float64)
    assert summary.length == T
    torch.testing.assert_close(summary.count, final.cache_count, rtol=0, atol=0)
    torch.testing.assert_close(summary.mean, final.cache_mean, rtol=1e-12, atol=1e-12)
    for name in ("k", "v", "z"):
        assert torch.equal(getattr(summary, f"last_{name}"), getattr(final, f"recent_{name}")), name


def test_chunk_not_whole_blocks_is_refused():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 1, 1, 12, 8, 3)
    with pytest.raises(ValueError) as err:
        chunk_summary(k_hat, v, z, block_len=8, n_code=3, acc_dtype=torch.float64)
    assert str(err.value) == ("context parallelism splits sequences into chunks of whole blocks: a chunk of 12 tokens "
                              "is not a positive multiple of block_len=8; make each rank's share of the sequence a "
                              "multiple of 8")


def test_state_mid_block_is_refused():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 1, 1, 13, 4, 3)
    _, state = vq_attention(q[:, :, :5], k_hat[:, :, :5], v[:, :, :5], bias[:, :, :5], block_len=4,
                            z=z[:, :, :5], codebook=codebook)
    summary = chunk_summary(k_hat[:, :, 5:13], v[:, :, 5:13], z[:, :, 5:13], block_len=4, n_code=3,
                            acc_dtype=torch.float64)
    with pytest.raises(ValueError) as err:
        compose(state, summary, 4)
    assert str(err.value) == ("context parallelism composes states at block boundaries: the incoming state's offset 5 "
                              "is not a multiple of block_len=4")


def test_window_only_is_refused():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 1, 1, 8, 4, 3)
    with pytest.raises(ValueError) as err:
        vq_attention_context_parallel(q, k_hat, v, bias, block_len=4, group=None, z=z, codebook=codebook,
                                      compressive_cache=False)
    assert str(err.value) == ("context parallelism hands each rank the per-code cache of the ranks before it; "
                              "compressive_cache=False is not supported with it")
