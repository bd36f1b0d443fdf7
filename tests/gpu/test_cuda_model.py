"""The model on CUDA: float32 equals the CPU, bfloat16 autocast (forward and backward, state carried) is finite and
close to float32, and the compiled units (``tvq train --torch-compile``, Triton kernels on a GPU) equal eager.

Run with ``python -m pytest -m gpu tests/gpu`` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import copy

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.models.tvq.compile import compile_units

pytestmark = pytest.mark.gpu

WINDOWS, WIDTH = 3, 32  # three windows of 32 tokens (L 8): the state is carried twice


def small_model(**overrides):
    """A model of 2 units with 4 heads and non-zero position and content biases, in training mode on the CPU."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", d_model=64, n_code=16, n_layers=1, head_type="mha", n_head=4, d_v=64,
                                 **overrides)).train()
    with torch.no_grad():
        for unit in model.units:
            unit.u.normal_()
            unit.v_r.normal_()
    return model


def windows(model, device, precision="float32"):
    """Losses, final logits and gradients of ``WINDOWS`` training windows with the state carried."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, WINDOWS * WIDTH + 1), generator=gen).to(device)
    losses, state = [], None
    for w in range(WINDOWS):
        lo = w * WIDTH
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            out = model(ids[:, lo:lo + WIDTH], state, targets=ids[:, lo + 1:lo + WIDTH + 1])
        out.loss.backward()
        losses.append(out.loss.detach().float().cpu())
        state = out.state.detach()
    grads = {name: p.grad.detach().float().cpu() for name, p in model.named_parameters()}
    return torch.stack(losses), out.logits.detach().float().cpu(), grads


def test_float32_on_cuda_equals_cpu():
    model = small_model()
    cuda = copy.deepcopy(model).cuda()
    losses, logits, grads = windows(cuda, "cuda")
    want_losses, want_logits, want_grads = windows(model, "cpu")
    # float32 on two devices: summation order differs (TF32 is off for matmuls by default)
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, want_logits, rtol=1e-3, atol=1e-3)
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-3, atol=1e-4, msg=name)
    # the codebooks were updated from the same statistics
    for mine, theirs in zip(cuda.quantizers, model.quantizers):
        torch.testing.assert_close(mine.acc_count.cpu(), theirs.acc_count, rtol=0, atol=0)


def test_bfloat16_autocast_is_finite_and_close_to_float32():
    model = small_model().cuda()
    low = copy.deepcopy(model)
    losses, logits, grads = windows(model, "cuda")
    low_losses, low_logits, low_grads = windows(low, "cuda", "bfloat16")
    assert torch.isfinite(low_losses).all() and torch.isfinite(low_logits).all()
    # bfloat16 keeps 8 bits of mantissa (relative steps of 2^-8 = 0.4%): the losses agree to about 1%
    torch.testing.assert_close(low_losses, losses, rtol=2e-2, atol=0)
    for name, g in grads.items():
        assert torch.isfinite(low_grads[name]).all(), name
        if g.norm() > 0:  # the gradient points the same way (cosine), whatever the rounding
            cosine = torch.nn.functional.cosine_similarity(low_grads[name].flatten(), g.flatten(), dim=0)
            assert cosine > 0.97, (name, float(cosine))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_compiled_units_on_cuda_equal_eager(precision):
    model = small_model().cuda()
    eager = copy.deepcopy(model)
    compile_units(model)
    losses, logits, grads = windows(model, "cuda", precision)
    want_losses, want_logits, want_grads = windows(eager, "cuda", precision)
    # fused kernels round differently: float32 to ~1e-5, bfloat16 to its 2^-8 steps
    tol = 1e-4 if precision == "float32" else 2e-2
    torch.testing.assert_close(losses, want_losses, rtol=tol, atol=tol)
    torch.testing.assert_close(logits, want_logits, rtol=tol, atol=10 * tol)
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=10 * tol, atol=tol, msg=name)
