"""Encoders (``causal=False``) and quantized queries in the layer and the model: the linear-time path equals the dense
formula, padding changes nothing for real tokens, the bias covers the three-block window in both directions."""

from __future__ import annotations

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import ConfigError
from transformer_vq.ops.full.bidir import full_bidir_attention
from transformer_vq.ops.vq_bidir import vq_bidir_attention_naive

ENCODERS = {
    "vq": dict(),
    "vq-mha": dict(head_type="mha", n_head=2, d_v=64),
    "qk": dict(quantize_queries=True),
    "qk-mqa": dict(quantize_queries=True, head_type="mqa", n_head=2, d_v=64),
}


def tiny_encoder(seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, causal=False, **overrides)).to(dtype).eval()
    with torch.no_grad():
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
    return model


def ids_of(shape, seed, high=256):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", ENCODERS)
@pytest.mark.parametrize("length", [3, 16, 37])
def test_encoder_linear_equals_quadratic(variant, length):
    model = tiny_encoder(**ENCODERS[variant])
    ids = ids_of((2, length), 1, high=257)  # the mask token (256) is an input of an encoder
    torch.testing.assert_close(model(ids).logits, model(ids, attention="quadratic").logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", ["vq", "qk"])
def test_appended_padding_changes_nothing_for_real_tokens(variant):
    model = tiny_encoder(**ENCODERS[variant])
    ids = ids_of((2, 21), 2)
    padded = torch.cat([ids, ids_of((2, 9), 3)], dim=1)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[:, :21] = True
    torch.testing.assert_close(model(padded, mask=mask).logits[:, :21], model(ids).logits, rtol=1e-10, atol=1e-10)


def test_every_output_depends_on_later_tokens_too():
    """The opposite of the causal model's causality test: a later token changes an earlier output."""
    model = tiny_encoder()
    ids = ids_of((1, 20), 4)
    changed = ids.clone()
    changed[0, 19] = (changed[0, 19] + 1) % 256
    assert not torch.allclose(model(ids).logits[0, 0], model(changed).logits[0, 0])


def test_encoder_bias_is_the_relative_position_term_of_both_directions():
    model = tiny_encoder()
    unit, L = model.units[0], 4
    q = torch.randn(1, 1, 13, 16, dtype=torch.float64)
    bias = unit._window_bias(q, 0)  # (1, 1, 13, 3L)
    distances = unit._distances()
    rel = unit._relative_table(q.dtype)[0]  # (4L - 1, Dk)
    query = q[0, 0] + unit.v_r[0] * 16 ** -0.25
    for t in range(13):
        for j in range(3 * L):
            d = t - ((t // L - 1) * L + j)
            row = int((distances == d).nonzero())
            torch.testing.assert_close(bias[0, 0, t, j], query[t] @ rel[row], rtol=1e-12, atol=1e-12)


def test_full_encoder_is_the_dense_formula_on_unquantized_keys():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 2, 11, 8, generator=gen, dtype=torch.float64), torch.randn(2, 1, 11, 8, generator=gen,
                                                                                       dtype=torch.float64)
    v, bias = torch.randn(2, 1, 11, 5, generator=gen, dtype=torch.float64), torch.randn(2, 2, 11, 12, generator=gen,
                                                                                         dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    out, state = full_bidir_attention(q, k, v, bias, block_len=4, mask=mask)
    assert state is None
    torch.testing.assert_close(out, vq_bidir_attention_naive(q, k, v, bias, block_len=4, mask=mask), rtol=1e-12,
                               atol=1e-12)


def test_full_attention_encoder_model_runs_and_ignores_padding():
    model = tiny_encoder(attn_type="full")
    ids = ids_of((1, 10), 6)
    mask = torch.tensor([[True] * 7 + [False] * 3])
    torch.testing.assert_close(model(ids, mask=mask).logits[:, :7], model(ids[:, :7]).logits, rtol=1e-10, atol=1e-10)


def test_encoder_refuses_state_and_sampling():
    model = tiny_encoder()
    out = model(ids_of((1, 8), 7))
    assert out.state is None
    with pytest.raises(ValueError, match="carries no state"):
        model(ids_of((1, 8), 7), state=object())
    with pytest.raises(ValueError, match="sampling needs a causal model"):
        model.generate(ids_of((1, 4), 8), 3)


def test_mask_token_is_an_input_only():
    model = tiny_encoder(dtype=torch.float32)
    assert model.embed.num_embeddings == 257 and model(ids_of((1, 4), 9)).logits.shape[-1] == 256
    with pytest.raises(ValueError, match=r"targets holds token id 256, outside the vocabulary \[0, 256\)"):
        model(ids_of((1, 4), 9), targets=torch.full((1, 4), 256))


@pytest.mark.parametrize("overrides, field, text", [
    (dict(quantize_queries=True, attn_type="full"), "quantize_queries",
     "quantize_queries applies only with attn_type 'vq' \\(this run has attn_type 'full'\\), got True"),
    (dict(causal=False, attn_type="flash"), "causal",
     "causal applies only with attn_type 'vq' or 'full' \\(this run has attn_type 'flash'\\), got False"),
])
def test_config_refuses_combinations_without_an_operator(overrides, field, text):
    with pytest.raises(ConfigError, match=text) as info:
        preset("tiny", **overrides)
    assert info.value.problems[0][0] == field


def test_query_codebooks_learn_and_report_their_own_metrics():
    model = tiny_encoder(dtype=torch.float32, quantize_queries=True).train()
    ids = ids_of((2, 16), 10)
    model(ids, targets=ids).loss.backward()
    before = [q.codebook.clone() for q in model.quantizers]
    model.update_codebooks()
    assert len(model.quantizers) == 2 * len(model.units)
    assert all(not torch.equal(b, q.codebook) for b, q in zip(before, model.quantizers))
    metrics = model.codebook_metrics()
    assert set(metrics) == {"codebook_perplexity", "codebook_unused", "query_codebook_perplexity",
                            "query_codebook_unused"}
