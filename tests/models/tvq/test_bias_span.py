"""The relative-position bias and its span: 'window' (distances up to 2L - 1) or 'block' (up to L, the authors' code),
checked against the formula written out here in float64; the sinusoid table exact in float64; old configs and
checkpoints without the field read as 'window'."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_vq import GatedAttentionUnit, TransformerVQ, preset
from transformer_vq.config import ConfigError, TransformerVQConfig
from transformer_vq.nn.position import sinusoids
from transformer_vq.train.checkpoint import CheckpointError, check_architecture


def table_row(d: int, dim: int, max_wavelength: float = 1e5) -> torch.Tensor:
    """The sinusoid of distance ``d`` entry by entry with Python floats (App. C)."""
    angles = [d * max_wavelength ** (-2 * j / dim) for j in range(dim // 2)]
    return torch.tensor([math.sin(a) for a in angles] + [math.cos(a) for a in angles], dtype=torch.float64)


def reference_bias(unit: GatedAttentionUnit, q: torch.Tensor, offset: int, span: int) -> torch.Tensor:
    """``[T, W]`` bias of one head, query by query and key by key: ``(q + v_r) . R_d`` inside the span, else 0."""
    cfg, Dk = unit.cfg, unit.d_k
    L, n_columns = cfg.block_len, (2 if cfg.causal else 3) * cfg.block_len
    w_r, v_r = unit.w_r.weight[:Dk], unit.v_r[0]  # autograd follows them: the gradients are checked too
    out = torch.zeros(q.shape[0], n_columns, dtype=torch.float64)
    for t in range(q.shape[0]):
        tau = offset + t
        for j in range(n_columns):
            d = tau - ((tau // L - 1) * L + j)  # query minus key position
            if (0 <= d or not cfg.causal) and abs(d) <= span:
                r = (w_r @ table_row(d, cfg.d_model)) * Dk ** -0.25
                out[t, j] = (q[t] + v_r * Dk ** -0.25) @ r
    return out


def unit_of(**overrides) -> GatedAttentionUnit:
    torch.manual_seed(1)
    unit = GatedAttentionUnit(preset("tiny", n_code=6, **overrides)).to(torch.float64).eval()
    with torch.no_grad():
        unit.v_r.normal_()
    return unit


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_len", [1, 3, 4])
@pytest.mark.parametrize("bias_span", ["window", "block"])
def test_bias_is_the_formula_up_to_its_span(bias_span, block_len, causal):
    unit = unit_of(block_len=block_len, bias_span=bias_span, causal=causal)
    q = torch.randn(1, 1, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(block_len))
    span = block_len if bias_span == "block" else 2 * block_len - 1
    for offset in (0, 5):
        with torch.no_grad():
            bias = unit._window_bias(q, offset)[0, 0]
        torch.testing.assert_close(bias, reference_bias(unit, q[0, 0], offset, span), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias_span", ["window", "block"])
def test_bias_gradients_are_the_formulas(bias_span, causal):
    """Gradients to the queries, ``v_r`` and ``W_r`` through the bias (read with one index per block of rows, the
    columns without a bias from a zero row) equal those of the written-out formula, at a length that ends mid-block
    and an offset that starts mid-block."""
    L, T = 3, 11
    unit = unit_of(block_len=L, bias_span=bias_span, causal=causal)
    span = L if bias_span == "block" else 2 * L - 1
    cotangent = torch.randn(T, (2 if causal else 3) * L, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(2))
    grads = []
    for compute in (lambda q: unit._window_bias(q, 5)[0, 0], lambda q: reference_bias(unit, q[0, 0], 5, span)):
        unit.zero_grad(set_to_none=True)
        q = torch.randn(1, 1, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        (compute(q) * cotangent).sum().backward()
        grads.append((q.grad, unit.v_r.grad, unit.w_r.weight.grad))
    for ours, formula in zip(*grads):
        torch.testing.assert_close(ours, formula, rtol=1e-12, atol=1e-12)


def test_block_span_zeroes_exactly_the_distances_beyond_block_len():
    L = 4
    q = torch.randn(1, 1, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        window, block = (unit_of(block_len=L, bias_span=s)._window_bias(q, 0)[0, 0] for s in ("window", "block"))
    t, j = torch.arange(12)[:, None], torch.arange(2 * L)[None, :]
    distance = t - (t // L - 1) * L - j
    kept = (distance >= 0) & (distance <= L)
    torch.testing.assert_close(block[kept], window[kept], rtol=1e-14, atol=1e-14)  # tables of two lengths
    assert torch.count_nonzero(block[~kept]) == 0
    assert torch.count_nonzero(window[distance > L]) == int((distance > L).sum())  # window: a bias there


def tiny_pair(**overrides) -> tuple[TransformerVQ, TransformerVQ]:
    """Two float64 models with the same weights, one per span."""
    models = []
    for span in ("window", "block"):
        torch.manual_seed(0)
        model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, bias_span=span, **overrides))
        model = model.to(torch.float64).eval()
        with torch.no_grad():
            for unit in model.units:
                unit.v_r.normal_()
        models.append(model)
    return models[0], models[1]


def test_spans_differ_only_through_the_bias_beyond_block_len():
    window, block = tiny_pair()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # distances of the first L + 1 positions are at most L: both spans give the same bias there
        torch.testing.assert_close(window(ids[:, :5]).logits, block(ids[:, :5]).logits, rtol=1e-12, atol=1e-12)
        assert (window(ids).logits - block(ids).logits).abs().max() > 1e-3
        for model in (window, block):
            for unit in model.units:
                unit.w_r.weight.zero_()
                unit.v_r.zero_()
        torch.testing.assert_close(window(ids).logits, block(ids).logits, rtol=0, atol=0)


def test_block_span_state_and_decoding_continue_the_whole_sequence():
    _, block = tiny_pair()
    ids = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = block(ids).logits
        first = block(ids[:, :7])
        second = block(ids[:, 7:18], state=first.state)
        last = block(ids[:, 18:], state=second.state)  # one token: the decoding path
    torch.testing.assert_close(torch.cat([first.logits, second.logits, last.logits], 1), whole, rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(block(ids, attention="quadratic").logits, whole, rtol=1e-10, atol=1e-10)


def test_bad_span_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="bias_span must be one of window, block, got 'authors'"):
        preset("tiny", bias_span="authors")


def test_config_without_the_field_reads_as_window():
    saved = preset("tiny").to_dict()
    del saved["bias_span"]
    assert TransformerVQConfig.from_dict(saved).bias_span == "window"
    check_architecture(saved, preset("tiny"), path="old")  # an old checkpoint resumes with today's default
    with pytest.raises(CheckpointError, match="bias_span='window' \\(checkpoint\\) vs 'block' \\(this run\\)"):
        check_architecture(saved, preset("tiny", bias_span="block"), path="old")


@pytest.mark.parametrize("dim", [8, 768])
def test_sinusoids_in_float64_are_exact(dim):
    distances = torch.arange(0, 1024, 37)
    table = sinusoids(distances, dim, dtype=torch.float64)
    expected = torch.stack([table_row(int(d), dim) for d in distances])
    assert table.dtype == torch.float64
    torch.testing.assert_close(table, expected, rtol=0, atol=1e-13)
    assert (sinusoids(distances, dim).double() - expected).abs().max() > 1e-6  # float32: what float64 runs got before


def test_sinusoids_in_float32_and_half_are_built_in_float32():
    distances = torch.arange(0, 1024, 37)
    angles = distances.float()[:, None] * 1e5 ** (-torch.arange(4, dtype=torch.float32) * 2 / 8)
    expected = torch.cat([angles.sin(), angles.cos()], -1)
    assert torch.equal(sinusoids(distances, 8), expected)
    assert torch.equal(sinusoids(distances, 8, dtype=torch.bfloat16), expected.to(torch.bfloat16))
