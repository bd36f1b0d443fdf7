"""torch.compile (``tvq train --torch-compile``): the compiled operator and units equal eager, and recompiles stay
bounded.

Compiling with inductor costs one to two minutes per graph on a shared 2-core CPU with a cold cache (seconds with a
warm one), so the default suite traces without generating code: the operator through ``aot_eager`` (the forward and
backward graphs AOTAutograd hands inductor, run as they are) and the units through a counting backend. The inductor
checks (every reduction with and without grad, the units in training) are marked ``slow``:
``python -m pytest -m slow tests/models/tvq/test_compile.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import REDUCTIONS
from transformer_vq.models.tvq.compile import compile_units
from transformer_vq.ops.vq import vq_attention
from transformer_vq.train import load_config

# float32: compiled kernels fuse and reorder sums, so results differ from eager by float32 rounding only
TOL = dict(rtol=1e-5, atol=1e-5)
L = 4


@pytest.fixture(scope="module")
def compiled_op():
    """One inductor-compiled operator for every slow test (graphs are cached per shape, grad mode and reduction)."""
    torch._dynamo.reset()
    return torch.compile(vq_attention, dynamic=False)


def operator_inputs(T=20, seed=0):
    """Float32 ``q, k_hat, v, bias, z, codebook``: B 2, H 2, G 1, S 5, Dk 6, Dv 7, L 4 (T not a multiple of L)."""
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.randn(1, 5, 6, generator=gen)
    z = torch.randint(0, 5, (2, 1, T), generator=gen)
    k_hat = codebook[0][z]  # (B, G, T, Dk)
    q = torch.randn(2, 2, T, 6, generator=gen)
    v = torch.randn(2, 1, T, 7, generator=gen)
    bias = torch.randn(2, 2, T, 2 * L, generator=gen)
    return q, k_hat, v, bias, z, codebook


def outputs_and_grads(op, reduction, grad=True):
    q, k_hat, v, bias, z, codebook = operator_inputs()
    leaves = (q, k_hat, v, bias)
    for t in leaves:
        t.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out, state = op(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, reduction=reduction)
    if not grad:
        return out, state, ()
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    return out, state, torch.autograd.grad(out, leaves, cotangent)


def check_operator(compiled_op, reduction, grad):
    got, got_state, got_grads = outputs_and_grads(compiled_op, reduction, grad)
    want, want_state, want_grads = outputs_and_grads(vq_attention, reduction, grad)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_state.cache_mean, want_state.cache_mean, **TOL)
    assert torch.equal(got_state.cache_count, want_state.cache_count)
    assert len(got_grads) == len(want_grads)
    for name, g, w in zip(("q", "k_hat", "v", "bias"), got_grads, want_grads):
        torch.testing.assert_close(g, w, **TOL, msg=name)


def test_traced_operator_equals_eager():
    check_operator(torch.compile(vq_attention, backend="aot_eager", dynamic=False), "serial", grad=True)


@pytest.mark.slow
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
def test_compiled_operator_equals_eager_every_reduction(compiled_op, reduction, grad):
    """Without grad the operator updates its scores in place: the compiled graph must keep that right too."""
    check_operator(compiled_op, reduction, grad)


def tiny_pair(**overrides):
    """A tiny model (2 units, L 4) and an identical copy, both in training mode."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", n_code=6, block_len=L, **overrides)).train()
    with torch.no_grad():
        for unit in model.units:  # non-zero content and position biases, so every term takes part
            unit.u.normal_()
            unit.v_r.normal_()
    return model, copy.deepcopy(model)


def train_windows(model, windows, width=8, per_batch=3):
    """Losses and gradients of ``windows`` windows with the state carried (a fresh batch every ``per_batch``)."""
    gen = torch.Generator().manual_seed(3)
    losses, grads, state = [], [], None
    for w in range(windows):
        if w % per_batch == 0:
            state = None
        ids = torch.randint(0, 256, (2, width + 1), generator=gen)
        out = model(ids[:, :-1], state, targets=ids[:, 1:])
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
        state = out.state.detach()
    return losses, grads


def test_units_recompile_a_bounded_number_of_times():
    """Training windows of one length, the state carried through offsets 0 .. 40, compile at most three graphs (no
    state; a state at one offset; then the offset symbolic), and the counting backend (the traced graphs run as
    they are) gives eager's numbers exactly. A second length adds at most two (with and without a state: the
    serial scan unrolls over the blocks of a call, so each block count has its own graphs), and then no more."""
    torch._dynamo.reset()
    counter = CompileCounter()
    model, eager = tiny_pair()
    assert compile_units(model, backend=counter) == 2
    got, got_grads = train_windows(model, 12, per_batch=6)
    want, want_grads = train_windows(eager, 12, per_batch=6)
    assert counter.frame_count <= 3, counter.frame_count
    assert torch.equal(torch.stack(got), torch.stack(want))
    assert all(torch.equal(g[name], w[name]) for g, w in zip(got_grads, want_grads) for name in w)
    first = counter.frame_count
    train_windows(model, 4, width=12, per_batch=2)
    assert counter.frame_count <= first + 2, counter.frame_count
    settled = counter.frame_count
    train_windows(model, 12, per_batch=6)
    train_windows(model, 4, width=12, per_batch=2)
    assert counter.frame_count == settled
    # and the checkpointed names are the plain model's: compiling wraps the call, not the module
    assert model.state_dict().keys() == eager.state_dict().keys()


@pytest.mark.slow
def test_compiled_units_equal_eager_training():
    """Inductor-compiled units: losses and every gradient of four windows (state carried) equal eager's."""
    torch._dynamo.reset()
    model, eager = tiny_pair()
    compile_units(model)
    got, got_grads = train_windows(model, 4)
    want, want_grads = train_windows(eager, 4)
    torch.testing.assert_close(torch.stack(got), torch.stack(want), **TOL)
    for g, w in zip(got_grads, want_grads):
        for name in w:
            torch.testing.assert_close(g[name], w[name], **TOL, msg=name)


def test_compile_units_refuses_a_model_without_units():
    with pytest.raises(ValueError, match="compile_units: Linear holds no GatedAttentionUnit to compile"):
        compile_units(torch.nn.Linear(2, 2))


def test_compile_is_a_train_option():
    from transformer_vq.cli import build_parser

    assert not load_config("tiny").train.torch_compile
    assert load_config("tiny", overrides=["torch_compile=true"]).train.torch_compile
    assert build_parser().parse_args(["train", "--torch-compile"]).torch_compile is True
