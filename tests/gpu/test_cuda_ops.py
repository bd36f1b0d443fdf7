"""The operators on CUDA equal their CPU results: VQ attention with every reduction (outputs, carried state and
gradients, whole sequences and a sequence split across calls), VQ with quantized queries, and the baselines.

Run with ``python -m pytest -m gpu tests/gpu`` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import pytest
import torch

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops import KERNELS
from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq_qk import vq_qk_attention

pytestmark = pytest.mark.gpu

# float64 on both devices: only summation order differs, so the results agree to ~1e-12
TOL = dict(rtol=1e-9, atol=1e-9)
B, H, G, T, L, S, DK, DV = 2, 4, 2, 45, 8, 6, 8, 5  # T not a multiple of L: all three kernel segments run
SPLITS = {"whole": (T,), "split": (3, 8, 29, T)}  # mid-block starts, one token, whole blocks, a tail
GRADS = ("q", "k", "v", "bias")


def inputs(device, seed=0):
    """The operator's inputs on ``device`` (the same numbers on every device), gradients on ``q, k, v, bias``."""
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.randn(G, S, DK, generator=gen, dtype=torch.float64)
    codebook_q = torch.randn(H, S, DK, generator=gen, dtype=torch.float64)
    z = torch.randint(0, S, (B, G, T), generator=gen)
    z_q = torch.randint(0, S, (B, H, T), generator=gen)
    x = {"k": codebook[torch.arange(G)[None, :, None], z], "q": codebook_q[torch.arange(H)[None, :, None], z_q],
         "v": torch.randn(B, G, T, DV, generator=gen, dtype=torch.float64),
         "bias": torch.randn(B, H, T, 2 * L, generator=gen, dtype=torch.float64),
         "z": z, "z_q": z_q, "codebook": codebook, "codebook_q": codebook_q}
    return {name: t.to(device).requires_grad_(name in GRADS) for name, t in x.items()}


def run(op, x, splits, options):
    """Output, final state and the gradients of ``q, k, v, bias`` over the sequence cut at ``splits``;
    ``options(piece)`` gives the operator's other arguments for one call."""
    outs, state, start = [], None, 0
    for stop in splits:
        piece = slice(start, stop)
        out, state = op(*(x[n][:, :, piece] for n in GRADS), block_len=L, state=state, **options(x, piece))
        outs.append(out)
        start = stop
    out = torch.cat(outs, dim=2)
    cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
    grads = torch.autograd.grad(out, [x[n] for n in GRADS], cotangent, allow_unused=True)
    return out, state, grads


def check_cuda_equals_cpu(op, splits, options):
    out, state, grads = run(op, inputs("cuda"), splits, options)
    want, want_state, want_grads = run(op, inputs("cpu"), splits, options)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), want, **TOL)
    for name, g, w in zip(GRADS, grads, want_grads):
        assert (g is None) == (w is None), name
        if w is not None:
            torch.testing.assert_close(g.cpu(), w, **TOL, msg=name)
    assert state.offset == want_state.offset == T
    if hasattr(want_state, "cache_count"):
        torch.testing.assert_close(state.cache_count.cpu(), want_state.cache_count, rtol=0, atol=0)
        torch.testing.assert_close(state.cache_mean.cpu(), want_state.cache_mean, **TOL)


@pytest.mark.parametrize("splits", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_vq_attention_on_cuda_equals_cpu(reduction, splits):
    check_cuda_equals_cpu(vq_attention, splits, lambda x, piece: {
        "z": x["z"][:, :, piece], "codebook": x["codebook"], "reduction": reduction})


@pytest.mark.parametrize("splits", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_vq_qk_attention_on_cuda_equals_cpu(reduction, splits):
    check_cuda_equals_cpu(vq_qk_attention, splits, lambda x, piece: {
        "z": x["z"][:, :, piece], "codebook": x["codebook"], "z_q": x["z_q"][:, :, piece],
        "codebook_q": x["codebook_q"], "reduction": reduction})


@pytest.mark.parametrize("attn_type", [name for name in KERNELS if name != "vq"])
def test_baselines_on_cuda_equal_cpu(attn_type):
    options = {"chunk_len": 8} if attn_type == "flash" else {}
    check_cuda_equals_cpu(KERNELS[attn_type], SPLITS["split"], lambda x, piece: options)
