"""Context parallelism over real ranks (gloo, CPU, 2 and 4 processes): each rank's output is its slice of the
single-process call, the gradients summed over ranks are its gradients, and every rank ends with its final state."""

from __future__ import annotations

import pytest
import torch
from distutil import run_gloo
from opsutil import assert_same_state, doc_start_mask, make_vq_inputs

from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq.context_parallel import vq_attention_context_parallel

B, H, G, L, S = 2, 4, 2, 4, 5
NAMES = ("q", "k_hat", "v", "bias")


def inputs(lengths, prefix, dtype, starts=None):
    """Leaves ``q, k_hat, v, bias`` of the whole sequence after ``prefix`` tokens, its codes, the codebook, the state
    after the prefix (packed with documents beginning at ``starts`` per row, when given) and a cotangent for the
    output."""
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, prefix + sum(lengths), L, S, dtype=dtype,
                                                    seed=len(lengths))
    state = None
    if prefix:
        doc_start = None if starts is None else doc_start_mask(starts, prefix)
        _, state = vq_attention(q[:, :, :prefix], k_hat[:, :, :prefix], v[:, :, :prefix], bias[:, :, :prefix],
                                block_len=L, z=z[:, :, :prefix], codebook=codebook, doc_start=doc_start)
    leaves = [t[:, :, prefix:].clone().requires_grad_() for t in (q, k_hat, v, bias)]
    cotangent = torch.linspace(-1, 1, B * H * sum(lengths) * v.shape[-1], dtype=dtype).view(B, H, sum(lengths), -1)
    return leaves, z[:, :, prefix:], codebook, state, cotangent


def worker(rank, world, lengths, prefix, dtype, starts=None):
    (q, k_hat, v, bias), z, codebook, state, cotangent = inputs(lengths, prefix, dtype, starts)
    first = sum(lengths[:rank])
    mine = slice(first, first + lengths[rank])
    out, final = vq_attention_context_parallel(q[:, :, mine], k_hat[:, :, mine], v[:, :, mine], bias[:, :, mine],
                                               block_len=L, group=None, z=z[:, :, mine], codebook=codebook,
                                               state=state)
    (out * cotangent[:, :, mine]).sum().backward()
    return {"out": out.detach(), "grads": [t.grad for t in (q, k_hat, v, bias)], "final": final.detach()}


# (lengths per rank, tokens consumed before): equal chunks, one block per rank, unequal chunks, after a prefix
CASES = [([8, 8], 0), ([12, 12], 8), ([4, 20], 4), ([8, 8, 8, 8], 0), ([4, 8, 12, 4], 12)]


# float64 everywhere; float32 (to rounding) on an equal and an unequal split, as each case spawns its processes (~10 s)
RUNS = [(*case, torch.float64) for case in CASES] + [(*CASES[3], torch.float32), (*CASES[2], torch.float32)]


@pytest.mark.parametrize("lengths,prefix,dtype", RUNS, ids=lambda c: str(c).replace(" ", "").replace("torch.", ""))
def test_ranks_equal_one_process(lengths, prefix, dtype, tmp_path):
    check_ranks_equal_one_process(lengths, prefix, dtype, tmp_path)


def test_state_with_documents(tmp_path):
    """The state of a packed call whose last block holds document starts (row 0: one, row 1: two): every rank
    continues it as one process does, the last document's keys alone joining the cache."""
    check_ranks_equal_one_process([4, 12], 12, torch.float64, tmp_path, [[0, 9], [0, 10, 11]])


def check_ranks_equal_one_process(lengths, prefix, dtype, tmp_path, starts=None):
    results = run_gloo(worker, len(lengths), tmp_path, lengths, prefix, dtype, starts)
    (q, k_hat, v, bias), z, codebook, state, cotangent = inputs(lengths, prefix, dtype, starts)
    out, final = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, state=state)
    (out * cotangent).sum().backward()
    # float64: only the order of the merges differs (rounding, ~1e-16); float32: ~1e-7 relative, amplified a little by
    # the softmax over S + 2L terms
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(torch.cat([r["out"] for r in results], dim=2), out.detach(), rtol=tol, atol=tol)
    for i, (name, leaf) in enumerate(zip(NAMES, (q, k_hat, v, bias))):
        # each rank holds the gradient of its own chunk (zeros elsewhere): their sum is the whole gradient
        total = sum(r["grads"][i] for r in results)
        torch.testing.assert_close(total, leaf.grad, rtol=tol, atol=tol, msg=lambda m: f"grad {name}: {m}")
    for r in results:
        assert_same_state(r["final"], final, tol)
        assert torch.equal(r["final"].recent_start, final.recent_start)
