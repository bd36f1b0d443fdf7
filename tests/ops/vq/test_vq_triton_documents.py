"""Packed documents through the fused Triton backend: the eager operator's numbers, which are each document's alone.

Without CUDA the kernels run under Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``), in float32 at
sizes that run in seconds; on a CUDA machine the same tests run compiled, and the ``gpu``-marked ones add larger
sizes in bfloat16 (``pytest -m gpu``). The eager operator's packing is held to each document alone in float64 by
tests/ops/vq/test_vq_documents.py; here the fused backend is held to the dense formula (outputs) and to the eager
operator (every gradient, the state).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the kernels cannot run here", allow_module_level=True)
pytest.importorskip("triton")

from opsutil import (assert_as_close_as, doc_start_mask, low_precision_runs, make_vq_inputs,  # noqa: E402
                     same_reduction_tol)

from transformer_vq.ops.vq import vq_attention, vq_attention_naive  # noqa: E402

B, H, G, T, L, S = 2, 2, 1, 40, 8, 5
# Row 0: a start inside a block (3, 21), on block edges (8, 32), one-token documents and several in one block
# (8, 9, 10, 11); row 1: a document running over several blocks, one from the middle of a block to the end.
STARTS = ([0, 3, 8, 9, 10, 11, 21, 32], [0, 16, 30])
NAMES = ("q", "k_hat", "v", "bias")
# float32 with a few dozen terms per softmax: a few ulps of the O(1) outputs; the gradients sum Dv products in
# another order than torch.
TOL = 1e-5


def inputs(seed=0, dtype=torch.float32, shape=(B, H, G, T, L, S), d_k=6, d_v=7):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(*shape, Dk=d_k, Dv=d_v, dtype=dtype, seed=seed)
    leaves = [x.to(DEVICE).requires_grad_() for x in (q, k_hat, v, bias)]
    return leaves, z.to(DEVICE), codebook.to(DEVICE)


def run(leaves, z, codebook, backend, doc_start, state=None, block_len=L):
    return vq_attention(*leaves, block_len=block_len, z=z, codebook=codebook, state=state, backend=backend,
                        doc_start=doc_start)


def assert_grads_close(got, want, cotangent, leaves, tol):
    for name, a, b in zip(NAMES, torch.autograd.grad(got, leaves, cotangent), torch.autograd.grad(want, leaves,
                                                                                                   cotangent)):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol, msg=lambda m: f"grad {name}: {m}")


def test_packed_float32_matches_the_masked_formula_and_eager():
    leaves, z, codebook = inputs()
    doc_start = doc_start_mask(STARTS, T).to(DEVICE)
    out, state = run(leaves, z, codebook, "triton", doc_start)
    want, want_state = run(leaves, z, codebook, "eager", doc_start)
    dense = vq_attention_naive(*(x.detach().double() for x in leaves), block_len=L, doc_start=doc_start)
    torch.testing.assert_close(out.double(), dense, rtol=TOL, atol=TOL)
    torch.testing.assert_close(out, want, rtol=TOL, atol=TOL)
    assert_grads_close(out, want, torch.randn_like(out), leaves, TOL)
    torch.testing.assert_close(state.cache_count, want_state.cache_count, rtol=0, atol=0)
    order = same_reduction_tol(out.device)  # the same torch scan
    torch.testing.assert_close(state.cache_mean, want_state.cache_mean, rtol=order, atol=order)
    assert torch.equal(state.recent_start, want_state.recent_start)


def test_packed_with_state_carried_across_a_boundary_equals_one_call():
    """Truncated backprop: pieces cut inside blocks and on block edges, documents running from one piece into the
    next and beginning inside pieces; the starts given to the piece holding them only."""
    leaves, z, codebook = inputs(seed=1)
    doc_start = doc_start_mask(STARTS, T).to(DEVICE)
    whole, whole_state = run(leaves, z, codebook, "eager", doc_start)
    state, pieces = None, []
    for a, b in [(0, 5), (5, 24), (24, 29), (29, 40)]:
        starts = doc_start[:, a:b]
        out, state = run([x[:, :, a:b] for x in leaves], z[:, :, a:b], codebook, "triton",
                         starts if bool(starts.any()) else None, state=state)
        pieces.append(out)
    got = torch.cat(pieces, dim=2)
    torch.testing.assert_close(got, whole, rtol=TOL, atol=TOL)
    torch.testing.assert_close(state.cache_mean, whole_state.cache_mean, rtol=1e-6, atol=1e-6)
    assert torch.equal(state.recent_start, whole_state.recent_start)
    assert_grads_close(got, whole, torch.randn_like(whole), leaves, TOL)


def test_a_row_of_one_token_documents_sees_only_itself():
    """Every token its own document: the output is its own value, whatever the cache or the window hold."""
    leaves, z, codebook = inputs(seed=2, shape=(1, 1, 1, 16, L, S))
    out, _ = run(leaves, z, codebook, "triton", torch.ones(1, 16, dtype=torch.bool, device=DEVICE))
    torch.testing.assert_close(out, leaves[2].detach(), rtol=TOL, atol=TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_on_cuda_at_real_sizes_matches_eager_float32(dtype):
    gen = torch.Generator().manual_seed(3)
    shape = (2, 4, 2, 700, 64, 33)
    starts = [sorted({0, *torch.randint(0, 700, (12,), generator=gen).tolist(), 64, 128, 129}) for _ in range(2)]
    doc_start = doc_start_mask(starts, 700).to(DEVICE)
    leaves, z, codebook = inputs(seed=3, dtype=torch.float32, shape=shape, d_k=64, d_v=96)
    runs = low_precision_runs(lambda backend, given, book: run(given, z, book, backend, doc_start, block_len=64)[0],
                              leaves, codebook, dtype, DEVICE, seed=4)
    for name, got, expected, eager_low in zip(("out", *NAMES), *runs):
        if dtype == torch.float32:  # multiplied in full precision ("ieee"): a few ulps of the eager operator
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
        else:
            assert_as_close_as(got, expected, eager_low, name=name)
