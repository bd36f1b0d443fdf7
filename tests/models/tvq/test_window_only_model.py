"""A model without the compressive cache (``compressive_cache=False``): linear = dense window-only formula, windows
with state = whole, a constant-size decoding state, the config checks, and old configs loading with the default."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import ConfigError, TransformerVQConfig


def tiny(seed=0, **overrides):
    torch.manual_seed(seed)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, **overrides)).double().eval()
    with torch.no_grad():
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
    return model


IDS = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("compressive_cache", [True, False])
def test_linear_equals_quadratic_float64(compressive_cache):
    model = tiny(compressive_cache=compressive_cache)
    torch.testing.assert_close(model(IDS).logits, model(IDS, attention="quadratic").logits, rtol=1e-10, atol=1e-10)


def test_window_only_changes_the_output_beyond_two_blocks_only():
    with_cache, without = tiny(), tiny(compressive_cache=False)
    without.load_state_dict(with_cache.state_dict())
    a, b = with_cache(IDS).logits, without(IDS).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=1e-12, atol=1e-12)  # 2L = 8 positions: no older key yet
    assert (a[:, 8:] - b[:, 8:]).abs().amax() > 1e-6


def test_decoding_state_is_constant_size_and_matches_the_whole_sequence():
    model = tiny(compressive_cache=False)
    ids = IDS[:1, :21]
    whole = model(ids).logits
    state, pieces, sizes = None, [], []
    for t in range(ids.shape[1]):
        out = model(ids[:, t:t + 1], state)
        state = out.state
        pieces.append(out.logits)
        sizes.append(state.nbytes())
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    # the window holds fewer than 2L = 8 keys: from position 8 on, the size cycles and never grows
    assert max(sizes[8:]) == max(sizes[:8]) and len(set(sizes)) <= 7


def test_config_refuses_the_option_where_it_means_nothing():
    with pytest.raises(ConfigError, match="compressive_cache applies only with attn_type 'vq' and causal true \\(this "
                                          "run has attn_type 'full'\\), got False"):
        preset("tiny", attn_type="full", compressive_cache=False)
    with pytest.raises(ConfigError, match="\\(this run has causal false\\), got False"):
        preset("tiny", causal=False, compressive_cache=False)


def test_old_configs_load_with_the_default():
    saved = preset("tiny").to_dict()
    del saved["compressive_cache"]  # written before the field existed
    assert TransformerVQConfig.from_dict(json.loads(json.dumps(saved))).compressive_cache is True


def test_hf_config_carries_the_field(tmp_path):
    pytest.importorskip("transformers")
    from transformer_vq.hf import TransformerVQHFConfig

    cfg = preset("tiny", compressive_cache=False)
    TransformerVQHFConfig.from_model_config(cfg).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["compressive_cache"] is False
    assert TransformerVQHFConfig.from_pretrained(tmp_path).model_config() == cfg
    del saved["compressive_cache"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert TransformerVQHFConfig.from_pretrained(tmp_path).model_config().compressive_cache is True
