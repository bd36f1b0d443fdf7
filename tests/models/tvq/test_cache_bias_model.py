"""A model with a learned bias on the cache (``cache_bias_init``, docs/quality.md "A learned bias on the cache"):
linear = the dense formula with the bias, the bias learned (a gradient, no weight decay), decoding one token at a time
= the whole sequence, the config's refusals, and old configs loading without it."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import ConfigError, TransformerVQConfig
from transformer_vq.train.optim import param_groups


def tiny(init=-1.5, seed=0, **overrides):
    torch.manual_seed(seed)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, cache_bias_init=init,
                                 **overrides)).double().eval()
    with torch.no_grad():
        for i, unit in enumerate(model.units):  # non-zero u, v_r; a different bias per unit and head
            unit.u.normal_()
            unit.v_r.normal_()
            unit.cache_bias.add_(0.5 * i)
    return model


IDS = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("heads", [{}, {"head_type": "mqa", "n_head": 2}, {"head_type": "mha", "n_head": 2}],
                         ids=["shga", "mqa", "mha"])
def test_linear_equals_quadratic_float64(heads):
    model = tiny(**heads)
    assert all(unit.cache_bias.shape == (model.cfg.n_head,) for unit in model.units)
    torch.testing.assert_close(model(IDS).logits, model(IDS, attention="quadratic").logits, rtol=1e-10, atol=1e-10)


def test_the_bias_starts_at_its_init_and_is_learned_without_decay():
    model = tiny(init=-3.0)
    model.units[0].reset_parameters()
    assert model.units[0].cache_bias.tolist() == [-3.0]
    out = model(IDS[:, :-1], targets=IDS[:, 1:])
    out.loss.backward()
    assert all(unit.cache_bias.grad.abs().item() > 0 for unit in model.units)
    no_decay = next(group for group in param_groups(model, 0.1) if group["weight_decay"] == 0.0)["params"]
    assert all(any(p is unit.cache_bias for p in no_decay) for unit in model.units)


def test_it_changes_the_output_beyond_two_blocks_only():
    biased, plain = tiny(), TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4)).double().eval()
    plain.load_state_dict({k: v for k, v in biased.state_dict().items() if not k.endswith("cache_bias")})
    a, b = biased(IDS).logits, plain(IDS).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=1e-12, atol=1e-12)  # 2L = 8 positions: no older key yet
    assert (a[:, 8:] - b[:, 8:]).abs().amax() > 1e-6


def test_decoding_one_token_at_a_time_equals_the_whole_sequence():
    model = tiny()
    ids = IDS[:1, :21]
    state, pieces = None, []
    for t in range(ids.shape[1]):
        out = model(ids[:, t:t + 1], state)
        state = out.state
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(ids).logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("overrides, has", [
    ({"attn_type": "full"}, "attn_type 'full'"),
    ({"compressive_cache": False}, "compressive_cache false"),
    ({"causal": False}, "causal false"),
    ({"quantize_queries": True}, "quantize_queries true"),
    ({"attn_backend": "triton"}, "attn_backend 'triton'"),
], ids=["full", "window-only", "encoder", "quantized-queries", "triton"])
def test_config_refuses_it_where_it_means_nothing(overrides, has):
    with pytest.raises(ConfigError) as caught:
        preset("tiny", cache_bias_init=-3.0, **overrides)
    assert ("cache_bias_init applies only with attn_type 'vq' and causal true and compressive_cache true and "
            f"quantize_queries false and attn_backend 'eager' (this run has {has}), got -3.0") in str(caught.value)


def test_old_configs_load_without_it():
    saved = preset("tiny").to_dict()
    del saved["cache_bias_init"]  # written before the field existed
    cfg = TransformerVQConfig.from_dict(json.loads(json.dumps(saved)))
    assert cfg.cache_bias_init is None
    assert not any(name.endswith("cache_bias") for name in TransformerVQ(cfg).state_dict())
