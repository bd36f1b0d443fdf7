"""Context parallelism simulated in one process: R chunks, each attending from the state composed of the summaries of
the chunks before it, give the single call's outputs, gradients and final state (float64, to rounding)."""

from __future__ import annotations

import pytest
import torch
from opsutil import assert_holds_only_what_it_reports, assert_same_state, doc_start_mask, make_vq_inputs

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq.context_parallel import (OPTION_REFUSALS, chunk_summary, compose,
                                                    vq_attention_context_parallel_reference)
from transformer_vq.ops.vq.state import VQAttentionState

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
    tail = [t[:, :, prefix:] for t in (q, k_hat, v, bias, z)]
    return one_call_and_ranks(tail, codebook, L, R, state, reduction=reduction)


def one_call_and_ranks(inputs, codebook, L, R, state, **options):
    """``[(out, final state, gradients of q, k_hat, v, bias)]`` of the plain call and of ``R`` simulated ranks on
    ``inputs = (q, k_hat, v, bias, z)``, both from ``state``."""
    q, k_hat, v, bias, z = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    results = []
    for run in (lambda: vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, state=state, **options),
                lambda: vq_attention_context_parallel_reference(q, k_hat, v, bias, block_len=L, ranks=R, z=z,
                                                                codebook=codebook, state=state, **options)):
        out, final = run()
        cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads = torch.autograd.grad(out, (q, k_hat, v, bias), cotangent)
        results.append((out, final, grads))
    return results


def assert_same_results(results):
    """The simulated ranks gave the plain call's outputs, gradients and final state."""
    (out, final, grads), (cp_out, cp_final, cp_grads) = results
    # float64: the merges run in another order, so the results differ by rounding only (~1e-16 relative)
    torch.testing.assert_close(cp_out, out, rtol=1e-12, atol=1e-12)
    for name, got, want in zip(("q", "k_hat", "v", "bias"), cp_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"grad {name}: {m}")
    assert_same_state(cp_final, final, 1e-12)
    assert torch.equal(cp_final.recent_start, final.recent_start)
    assert_holds_only_what_it_reports(cp_final)


@pytest.mark.parametrize("prefix", [0, 8, 24], ids=lambda p: f"after{p}")
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_simulated_ranks_equal_one_call(case, reduction, prefix):
    assert_same_results(whole_and_split(case, reduction, prefix))


# How the incoming state was made: (first position of an empty state, tokens a call consumed from it, the document
# starts of that call per row, or None for no doc_start). Each state ends at a block boundary (L = 4).
INCOMING = {
    "docs-in-last-block": (0, 12, [[0, 9], [0, 11]]),
    "doc-at-block-edge": (0, 12, [[0, 8], [0, 8]]),
    "two-docs-one-row": (0, 12, [[0, 9, 11], [0]]),
    "docs-before-window": (0, 12, [[0, 5], [0, 6]]),
    "begun-mid-block": (1, 3, None),
    "begun-mid-block-docs": (2, 6, [[0, 3], [0]]),
}


@pytest.mark.parametrize("ranks", [2, 6])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("incoming", INCOMING, ids=str)
def test_state_with_documents_or_a_short_window(incoming, reduction, ranks):
    """A state whose window holds a document start (a packed call's) or fewer than ``L`` keys (a sequence begun
    inside a block) is continued by the ranks as by one call: its window joins the cache as the operator joins it."""
    first, consumed, starts = INCOMING[incoming]
    B, H, G, T, L, S = 2, 2, 1, 24, 4, 5
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, consumed + T, L, S, seed=consumed)
    doc_start = None if starts is None else doc_start_mask(starts, consumed)
    empty = VQAttentionState.empty(B, G, S, k_hat.shape[-1], v.shape[-1], dtype=v.dtype, offset=first)
    _, state = vq_attention(q[:, :, :consumed], k_hat[:, :, :consumed], v[:, :, :consumed], bias[:, :, :consumed],
                            block_len=L, z=z[:, :, :consumed], codebook=codebook, state=empty, doc_start=doc_start)
    assert state.offset % L == 0
    tail = [t[:, :, consumed:] for t in (q, k_hat, v, bias, z)]
    assert_same_results(one_call_and_ranks(tail, codebook, L, ranks, state, reduction=reduction))


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


@pytest.mark.parametrize("option, refused", [
    ({"compressive_cache": False}, "compressive_cache"),
    ({"doc_start": doc_start_mask([[0, 3]], 8)}, "doc_start"),
    ({"code_scores": torch.zeros(1, 1, 8, 3, dtype=torch.float64)}, "code_scores"),
    ({"chunk_len": 4}, None),
], ids=["window-only", "doc_start", "code_scores", "other"])
def test_options_not_honoured_are_refused(option, refused):
    """Options that the exchanged summaries ignore would give wrong numbers on every rank but the first."""
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 1, 1, 8, 4, 3)
    with pytest.raises(ValueError) as err:
        vq_attention_context_parallel_reference(q, k_hat, v, bias, block_len=4, ranks=2, z=z, codebook=codebook,
                                                **option)
    assert str(err.value) == OPTION_REFUSALS[refused]


def test_refusals_say_what_to_do():
    assert OPTION_REFUSALS["doc_start"] == ("context parallelism exchanges summaries of whole chunks that ignore "
                                            "packed documents: doc_start is not supported with it; pack documents "
                                            "without context parallelism")
    assert OPTION_REFUSALS[None] == ("context parallelism takes only the options reduction, backend, cache_bias of "
                                     "vq_attention (and compressive_cache=True): leave the others out")


def test_options_at_their_defaults_are_taken():
    q, k_hat, z, v, codebook, bias = make_vq_inputs(1, 2, 1, 16, 4, 3)
    inputs = dict(block_len=4, ranks=2, z=z, codebook=codebook)
    plain, _ = vq_attention_context_parallel_reference(q, k_hat, v, bias, **inputs)
    defaults, _ = vq_attention_context_parallel_reference(q, k_hat, v, bias, **inputs, compressive_cache=True,
                                                          doc_start=None, code_scores=None, reduction="serial",
                                                          backend="eager", cache_bias=None)
    assert torch.equal(defaults, plain)
