"""The fused Triton backend of VQ attention equals the eager operator and the dense formula, gradients included.

Without CUDA the kernels run under Triton's interpreter on the CPU (float32 and float16 only; the interpreter
mishandles bfloat16): tests/conftest.py sets ``TRITON_INTERPRET=1`` before anything imports triton. Shapes are small:
the interpreter runs every program in Python. The bfloat16 checks need a GPU (marker ``gpu``: ``pytest -m gpu``).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the kernels cannot run here", allow_module_level=True)
pytest.importorskip("triton")

from opsutil import (assert_as_close_as, assert_holds_only_what_it_reports, assert_same_state,  # noqa: E402
                     low_precision_runs, make_vq_inputs, same_reduction_tol, vq_grid_id)

from transformer_vq import GatedAttentionUnit, TransformerVQ, preset  # noqa: E402
from transformer_vq.config import ConfigError  # noqa: E402
from transformer_vq.ops.vq import vq_attention, vq_attention_naive  # noqa: E402
from transformer_vq.ops.vq.triton.function import DV_CHUNK  # noqa: E402

# (B, H, G, T, L, S), Dv: G < H with T not a multiple of L; multi-head with T = 2L; B > 1, L not a power of two
# (masked tiles) and values wider than one chunk of DV_CHUNK columns. Few programs each: the interpreter runs every
# program in Python, at a few tenths of a second each.
GRID = [((1, 2, 1, 40, 16, 5), 7), ((1, 2, 2, 32, 16, 7), 7), ((2, 1, 1, 50, 24, 3), DV_CHUNK + 12)]


def run(inputs, L, backend, state=None, **options):
    q, k_hat, z, v, codebook, bias = inputs
    return vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, state=state, backend=backend,
                        **options)


def grads(out, inputs, cotangent):
    """Gradients of ``q, k_hat, v, bias``."""
    q, k_hat, _, v, _, bias = inputs
    return torch.autograd.grad(out, (q, k_hat, v, bias), cotangent)


def vq_inputs(params, dtype, seed=0, d_v=7):
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S, Dk=6, Dv=d_v, dtype=dtype, seed=seed)
    return tuple(x.to(DEVICE).requires_grad_(x.is_floating_point() and x is not codebook)
                 for x in (q, k_hat, z, v, codebook, bias))


@pytest.mark.parametrize("params,d_v", GRID, ids=[f"{vq_grid_id(p)}-Dv{d}" for p, d in GRID])
def test_float32_matches_the_dense_formula_and_eager_gradients(params, d_v):
    L = params[4]
    inputs = vq_inputs(params, torch.float32, d_v=d_v)
    out, state = run(inputs, L, "triton")
    want, want_state = run(inputs, L, "eager")
    q, k_hat, _, v, _, bias = (x.detach().double() for x in inputs)
    # float32 with ~60 terms per softmax: a few ulps of the O(1) outputs.
    torch.testing.assert_close(out.double(), vq_attention_naive(q, k_hat, v, bias, block_len=L), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    cotangent = torch.randn_like(out)
    # Each score gradient sums Dv products in a different order than torch: its rounding grows with Dv.
    tol = 1e-5 if d_v < 16 else 1e-4
    # The key gradient is the eager operator's, with its truncation (keys older than the window get none).
    for name, got, expected in zip("q k_hat v bias".split(), grads(out, inputs, cotangent),
                                   grads(want, inputs, cotangent)):
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol, msg=lambda m: f"grad {name}: {m}")
    assert_same_state(state, want_state, same_reduction_tol(out.device))  # the summaries are the same torch code


def test_float16_matches_eager_float32():
    check_low_precision((1, 1, 1, 40, 16, 5), torch.float16, d_k=6, d_v=7)


def check_low_precision(params, dtype, d_k, d_v):
    """The fused kernels in ``dtype`` are as close to the eager operator in float32, outputs and gradients, as the
    eager operator in ``dtype`` is (the same rounded inputs for all three)."""
    B, H, G, T, L, S = params
    q, k_hat, z, v, codebook, bias = (x.to(DEVICE) for x in make_vq_inputs(B, H, G, T, L, S, Dk=d_k, Dv=d_v,
                                                                             dtype=torch.float32))

    def attend(backend, leaves, book):
        return vq_attention(*leaves, block_len=L, z=z, codebook=book, backend=backend)[0]

    runs = low_precision_runs(attend, [q, k_hat, v, bias], codebook, dtype, DEVICE)
    for name, got, expected, eager_low in zip("out q k_hat v bias".split(), *runs):
        assert_as_close_as(got, expected, eager_low, name=name)


def test_state_carried_across_splits_equals_one_eager_call():
    reduction = "matmul"  # the reductions are the eager operator's torch code, tested with it
    params = (1, 1, 1, 75, 16, 5)
    inputs = vq_inputs(params, torch.float32, seed=3)
    want, want_state = run(inputs, 16, "eager", reduction=reduction)
    state, pieces = None, []
    # A mid-block start, whole blocks after it, a tail: every piece of the operator's split is exercised.
    for a, b in [(0, 20), (20, 53), (53, 54), (54, 75)]:
        piece = tuple(x if i == 4 else x[:, :, a:b] for i, x in enumerate(inputs))  # all but the codebook
        out, state = run(piece, 16, "triton", state=state, reduction=reduction)
        pieces.append(out)
    got = torch.cat(pieces, dim=2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.cache_mean, want_state.cache_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state.recent_k, want_state.recent_k, rtol=0, atol=0)
    cotangent = torch.randn_like(want)
    # Gradients flow back through the carried state (its keys, values and cache means) as in one call.
    for name, g, e in zip("q k_hat v bias".split(), grads(got, inputs, cotangent), grads(want, inputs, cotangent)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"grad {name}: {m}")


def test_a_state_keeps_its_own_codes():
    """A loop that refills one code buffer per call gets the state of separate tensors: the state copies its codes
    (the eager kernel's rule)."""
    inputs = vq_inputs((1, 1, 1, 32, 16, 5), torch.float32, seed=4)
    want, want_state = run(inputs, 16, "triton")
    codes = inputs[2][:, :, :16].clone()  # the z of the first call, then refilled with the second call's codes
    first = tuple(codes if i == 2 else x if i == 4 else x[:, :, :16] for i, x in enumerate(inputs))
    _, state = run(first, 16, "triton")
    codes.copy_(inputs[2][:, :, 16:])
    second = tuple(codes if i == 2 else x if i == 4 else x[:, :, 16:] for i, x in enumerate(inputs))
    _, state = run(second, 16, "triton", state=state)
    assert torch.equal(state.recent_z, want_state.recent_z)
    torch.testing.assert_close(state.cache_mean, want_state.cache_mean, rtol=1e-6, atol=1e-6)
    assert_holds_only_what_it_reports(state)  # nor the call's keys or every block's prefixes, through slices


def test_the_layer_uses_the_backend_of_its_config():
    x = torch.randn(1, 37, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    results = []
    for backend in ("eager", "triton"):
        torch.manual_seed(0)  # the same weights: the backend is no parameter
        unit = GatedAttentionUnit(preset("tiny", block_len=16, attn_backend=backend))
        unit = unit.to(DEVICE)
        y = unit(x).x
        y.square().mean().backward()
        results.append((y, {n: p.grad for n, p in unit.named_parameters() if p.grad is not None}))
    (eager, eager_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    assert fused_grads.keys() == eager_grads.keys() and "w_k.weight" in eager_grads
    for name in eager_grads:
        torch.testing.assert_close(fused_grads[name], eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_bad_backends_are_refused(monkeypatch):
    inputs = vq_inputs((1, 1, 1, 16, 16, 3), torch.float32)
    with pytest.raises(ValueError, match="backend must be one of eager, triton, got 'cuda'"):
        run(inputs, 16, "cuda")
    scores = torch.zeros(1, 1, 16, 3, device=DEVICE)
    with pytest.raises(ValueError, match="computes the codeword scores itself: code_scores needs backend='eager'"):
        run(inputs, 16, "triton", code_scores=scores)
    with pytest.raises(ValueError, match="compressive_cache=False needs backend='eager'"):
        run(inputs, 16, "triton", compressive_cache=False)
    with pytest.raises(ConfigError, match="attn_backend applies only with attn_type 'vq' and causal true and "
                                          "compressive_cache true and quantize_queries false \\(this run has "
                                          "quantize_queries true\\), got 'triton'"):
        preset("tiny", attn_backend="triton", quantize_queries=True)
    wide = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    with pytest.raises(ValueError, match="computes in float32, float16 or bfloat16, got torch.float64"):
        run(wide, 16, "triton")
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="runs on CUDA tensors, got cpu; on a CPU set TRITON_INTERPRET=1"):
            run(inputs, 16, "triton")
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ImportError, match=r'needs the triton package: pip install -e "\.\[triton\]"'):
        run(inputs, 16, "triton")


@pytest.mark.gpu
@pytest.mark.parametrize("params", [(2, 4, 1, 1000, 128, 64), (1, 2, 2, 700, 64, 33)], ids=vq_grid_id)
def test_bfloat16_on_cuda_matches_eager_float32(params):
    check_low_precision(params, torch.bfloat16, d_k=64, d_v=96)


@pytest.mark.gpu
def test_bfloat16_layer_on_cuda_under_autocast_matches_eager():
    ids = torch.randint(0, 256, (2, 300), generator=torch.Generator().manual_seed(1)).cuda()
    logits = {}
    for backend, autocast in (("triton", True), ("eager", False), ("eager", True)):
        torch.manual_seed(0)
        model = TransformerVQ(preset("small", n_layers=1, attn_backend=backend)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits[backend, autocast] = model(ids).logits.float()
    assert_as_close_as(logits["triton", True], logits["eager", False], logits["eager", True], name="logits")
