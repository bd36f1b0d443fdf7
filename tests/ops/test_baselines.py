"""The baseline attention operators (full softmax, FLASH-Quad, FLASH) against their defining formulas.

Each operator is compared, in float64, with a dense formula written here loop by loop from its definition; then its
defining properties are checked: causality by Jacobian, state continuation (split calls == one call, down to one token
per call), FLASH with one chunk == FLASH-Quad, and ``full`` == the project's dense reference formula.
"""

from __future__ import annotations

import pytest
import torch

from transformer_vq.ops.flash_attention import FlashState, flash_attention, flash_quad_attention
from transformer_vq.ops.full_attention import KVCache, full_attention

# (H, G): single-head GAU, multi-head, multi-query.
HEADS = [(1, 1), (2, 2), (4, 1)]
# Lengths shorter than a block, not a multiple of the block or the chunk, and a single token.
LENGTHS = [1, 7, 37]
BLOCK_LEN = 4


def make_inputs(n_head, n_group, length, dtype=torch.float64, batch=2, d_k=8, d_v=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_head, length, d_k, generator=gen, dtype=dtype)
    k = torch.randn(batch, n_group, length, d_k, generator=gen, dtype=dtype)
    v = torch.randn(batch, n_group, length, d_v, generator=gen, dtype=dtype)
    bias = torch.randn(batch, n_head, length, 2 * BLOCK_LEN, generator=gen, dtype=dtype)
    return q, k, v, bias


def dense_beta(bias, block_len):
    """``beta [B, H, T, T]`` of SPEC-vq-attention.md, position by position."""
    batch, n_head, length, _ = bias.shape
    beta = torch.zeros(batch, n_head, length, length, dtype=bias.dtype)
    for t in range(length):
        window = (t // block_len - 1) * block_len
        for p in range(max(window, 0), t + 1):
            beta[:, :, t, p] = bias[:, :, t, p - window]
    return beta


def per_head(x, n_head):
    """Keys/values of group ``h // (H // G)`` for every query head ``h``: ``[B, G, T, D] -> [B, H, T, D]``."""
    return x.repeat_interleave(n_head // x.shape[1], dim=1)


def causal(length):
    return torch.ones(length, length, dtype=torch.bool).tril()


def softmax_formula(q, k, v, bias, block_len):
    n_head = q.shape[1]
    scores = q @ per_head(k, n_head).transpose(-1, -2) + dense_beta(bias, block_len)
    scores = scores.masked_fill(~causal(q.shape[2]), float("-inf"))
    return torch.softmax(scores, dim=-1) @ per_head(v, n_head)


def relu2_formula(q, k, v, bias, block_len, norm_len):
    n_head = q.shape[1]
    scores = q @ per_head(k, n_head).transpose(-1, -2) / norm_len + dense_beta(bias, block_len)
    return (torch.relu(scores).square() * causal(q.shape[2])) @ per_head(v, n_head)


def mixed_chunk_formula(q, k, v, bias, block_len, chunk_len):
    """FLASH, query by query: squared ReLU inside the chunk + mean of k v^T over the keys of earlier chunks."""
    n_head, length = q.shape[1], q.shape[2]
    kh, vh, beta = per_head(k, n_head), per_head(v, n_head), dense_beta(bias, block_len)
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for t in range(length):
        start = t // chunk_len * chunk_len
        scores = torch.einsum("bhd,bhpd->bhp", q[:, :, t], kh[:, :, start:t + 1]) / chunk_len + beta[:, :, t, start:t + 1]
        out[:, :, t] = torch.einsum("bhp,bhpe->bhe", torch.relu(scores).square(), vh[:, :, start:t + 1])
        if start > 0:
            kv = torch.einsum("bhpd,bhpe->bhde", kh[:, :, :start], vh[:, :, :start]) / start
            out[:, :, t] += torch.einsum("bhd,bhde->bhe", q[:, :, t], kv)
    return out


OPERATORS = {
    "full": (lambda q, k, v, b, state=None: full_attention(q, k, v, b, block_len=BLOCK_LEN, state=state),
             lambda q, k, v, b: softmax_formula(q, k, v, b, BLOCK_LEN)),
    "flash_quad": (lambda q, k, v, b, state=None: flash_quad_attention(q, k, v, b, block_len=BLOCK_LEN, state=state),
                   lambda q, k, v, b: relu2_formula(q, k, v, b, BLOCK_LEN, BLOCK_LEN)),
    # Chunks shorter than, equal to and longer than the block of the window bias.
    "flash_C2": (lambda q, k, v, b, state=None: flash_attention(q, k, v, b, chunk_len=2, state=state),
                 lambda q, k, v, b: mixed_chunk_formula(q, k, v, b, BLOCK_LEN, 2)),
    "flash_C4": (lambda q, k, v, b, state=None: flash_attention(q, k, v, b, chunk_len=4, state=state),
                 lambda q, k, v, b: mixed_chunk_formula(q, k, v, b, BLOCK_LEN, 4)),
    "flash_C16": (lambda q, k, v, b, state=None: flash_attention(q, k, v, b, chunk_len=16, state=state),
                  lambda q, k, v, b: mixed_chunk_formula(q, k, v, b, BLOCK_LEN, 16)),
}


def case_id(n_head, n_group, length):
    return f"H{n_head}-G{n_group}-T{length}"


GRID = [(h, g, t) for h, g in HEADS for t in LENGTHS]


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("n_head,n_group,length", GRID, ids=[case_id(*c) for c in GRID])
def test_matches_formula_float64(name, n_head, n_group, length):
    op, formula = OPERATORS[name]
    inputs = [x.requires_grad_() for x in make_inputs(n_head, n_group, length)]
    out, _ = op(*inputs)
    expected = formula(*inputs)
    # float64: only rounding differs (different summation order), so near machine precision.
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    cotangent = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, cotangent)
    expected_grads = torch.autograd.grad(expected, inputs, cotangent)
    for name_, got, want in zip("q k v bias".split(), grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"grad {name_}: {m}")


@pytest.mark.parametrize("name", list(OPERATORS))
def test_matches_formula_float32(name):
    op, formula = OPERATORS[name]
    inputs = make_inputs(4, 1, 37, dtype=torch.float32)
    out, _ = op(*inputs)
    expected = formula(*[x.double() for x in inputs])
    # float32 carries ~7 digits; sums of ~40 terms of size O(10) lose about two more.
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_full_equals_reference_formula():
    """``full`` is the project's dense reference formula with the keys left unquantized."""
    reference = pytest.importorskip("transformer_vq.ops.reference")
    for n_head, n_group in HEADS:
        q, k, v, bias = make_inputs(n_head, n_group, 37)
        out, _ = full_attention(q, k, v, bias, block_len=BLOCK_LEN)
        expected = reference.vq_attention_reference(q, k, v, bias, block_len=BLOCK_LEN)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_causal_by_jacobian(name):
    op, _ = OPERATORS[name]
    length = 13
    q, k, v, bias = make_inputs(2, 1, length, batch=1)

    def outputs(q, k, v, bias):
        return op(q, k, v, bias)[0]

    jac = torch.autograd.functional.jacobian(outputs, (q, k, v, bias))
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    for name_, j in zip("q k v bias".split(), jac):
        # j: [B, H, T, Dv] (output) x [B, H or G, T, D] (input); reduce to [T_out, T_in].
        dep = j.abs().sum(dim=(0, 1, 3, 4, 5, 7))
        assert dep[future].abs().max() == 0, f"{name}: output depends on future {name_}"
        assert (dep[~future] != 0).any(), f"{name}: output does not depend on past {name_}"


def split_points(length, gen):
    cuts = torch.randperm(length - 1, generator=gen)[:4].add(1).sort().values.tolist()
    return [0, *cuts, length]


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("n_head,n_group", HEADS, ids=[f"H{h}-G{g}" for h, g in HEADS])
def test_state_continuation(name, n_head, n_group):
    op, _ = OPERATORS[name]
    length = 37
    q, k, v, bias = make_inputs(n_head, n_group, length)
    whole, whole_state = op(q, k, v, bias)
    gen = torch.Generator().manual_seed(1)
    for points in (split_points(length, gen), split_points(length, gen), list(range(length + 1))):
        state, pieces = None, []
        for a, b in zip(points[:-1], points[1:]):
            out, state = op(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], state=state)
            pieces.append(out)
        torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-10, atol=1e-10)
        assert state.offset == whole_state.offset == length


def test_flash_with_one_chunk_is_flash_quad():
    for length in (5, 16):
        q, k, v, bias = make_inputs(4, 2, length)
        quad, _ = flash_quad_attention(q, k, v, bias, block_len=BLOCK_LEN, norm_len=16)
        mixed, state = flash_attention(q, k, v, bias, chunk_len=16)
        torch.testing.assert_close(mixed, quad, rtol=1e-12, atol=1e-12)
        assert state.n_chunks == length // 16


def test_states_detach_and_report_size():
    q, k, v, bias = make_inputs(2, 1, 9)
    k.requires_grad_()
    _, cache = full_attention(q, k, v, bias, block_len=BLOCK_LEN)
    assert isinstance(cache, KVCache) and cache.k.requires_grad and not cache.detach().k.requires_grad
    assert cache.nbytes() == (9 * 8 + 9 * 5) * 2 * 8  # (T Dk + T Dv) B float64 bytes
    _, state = flash_attention(q, k, v, bias, chunk_len=4)
    assert isinstance(state, FlashState) and state.n_chunks == 2 and state.chunk_k.shape[2] == 1
    detached = state.detach()
    assert not detached.kv_sum.requires_grad and not detached.chunk_k.requires_grad
    assert state.nbytes() == (8 * 5 + 8 + 5) * 2 * 8  # (Dk Dv + r Dk + r Dv) B float64 bytes, r = 1


def test_bad_shapes_are_named():
    q, k, v, bias = make_inputs(3, 2, 5)
    with pytest.raises(ValueError, match="the number of key/value groups G=2 must divide the number of heads H=3"):
        full_attention(q, k, v, bias, block_len=BLOCK_LEN)
    q, k, v, bias = make_inputs(2, 1, 5)
    with pytest.raises(ValueError, match=r"bias must be \[B, H, T, 2L\] = \[2, 2, 5, 6\], got \[2, 2, 5, 8\]"):
        flash_quad_attention(q, k, v, bias, block_len=3)
    _, state = flash_attention(q, k, v, bias, chunk_len=4)
    with pytest.raises(ValueError, match="state was built with chunk_len=4, got chunk_len=2"):
        flash_attention(q, k, v, bias, chunk_len=2, state=state)


@pytest.mark.parametrize("attn_type", ["full", "flash_quad", "flash"])
@pytest.mark.parametrize("head_type,n_head", [("shga", 1), ("mqa", 2), ("mha", 2)])
def test_model_with_baseline_continues_through_state(attn_type, head_type, n_head):
    """The model dispatches to the baseline cores; windows fed with the state carried equal the whole sequence."""
    from transformer_vq.config import preset
    from transformer_vq.nn.model import TransformerVQ

    torch.manual_seed(0)
    cfg = preset("tiny", attn_type=attn_type, head_type=head_type, n_head=n_head, flash_chunk_len=4)
    model = TransformerVQ(cfg).double().eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 29))
    whole = model(ids).logits
    state, pieces = None, []
    for a, b in [(0, 5), (5, 6), (6, 20), (20, 29)]:
        out = model(ids[:, a:b], state)
        state = out.state
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    assert state.offset == 29 and state.nbytes() > 0
