"""The softmax mass each unit gives beyond its two-block window: the dense formula's share, per unit and by history,
of a trained checkpoint and of the same configuration at initialization."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.models.tvq import gau
from transformer_vq.train.lm.build import model_from_checkpoint
from transformer_vq.train.lm.history_mass import check_measurable, history_mass, mass_profile, older_mass


def test_uniform_scores_share_by_count():
    # q = k = 0 and no bias: every visible key weighs the same, so the share is (#older keys) / (#visible keys)
    L, T = 4, 20
    q, k, bias = torch.zeros(1, 1, T, 3), torch.zeros(1, 1, T, 3), torch.zeros(1, 1, T, 2 * L)
    mass = older_mass(q, k, bias, block_len=L)[0, 0]
    expected = torch.tensor([max(0, (t // L - 1) * L) / (t + 1) for t in range(T)])
    torch.testing.assert_close(mass, expected)


def test_older_bias_moves_the_mass():
    L, T = 4, 16
    torch.manual_seed(0)
    q, k, bias = torch.randn(2, 2, T, 3), torch.randn(2, 1, T, 3), torch.randn(2, 2, T, 2 * L)
    low = older_mass(q, k, bias, block_len=L, older_bias=torch.tensor([-60.0, 0.0]))
    high = older_mass(q, k, bias, block_len=L, older_bias=torch.tensor([60.0, 0.0]))
    assert low[:, 0].max() < 1e-20 and torch.allclose(high[:, 0, 2 * L:], torch.ones(2, T - 2 * L))
    assert (high[:, :, :2 * L] == 0).all()  # the first two blocks have no older key
    torch.testing.assert_close(low[:, 1], high[:, 1])  # head 1's bias is 0 both times


def test_history_mass_of_a_trained_run(trained_run):
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    L = run_cfg.model.block_len
    rows = torch.randint(0, 256, (2, 4 * L))
    attend = gau.attend
    result = history_mass(model, rows)
    assert gau.attend is attend  # the observer is taken away again
    assert result["units"] == len(result["mean"]) >= 1
    assert [b["blocks"] for b in result["by_history"]] == [[2, 4]]
    assert all(0 < m < 1 for m in result["mean"])
    assert result["mean"] == pytest.approx(result["by_history"][0]["mass"])  # one bucket: the same queries
    with pytest.raises(ValueError, match="no query with a key older"):
        history_mass(model, rows[:, :2 * L])
    assert gau.attend is attend


def test_mass_profile_trained_and_at_init(trained_run):
    trained = mass_profile(str(trained_run), sequences=2, device="cpu")
    init = mass_profile(str(trained_run), sequences=2, init=True, device="cpu")
    assert trained["step"] == 6 and init["step"] == 0 and trained["seq_len"] == init["seq_len"]
    assert trained["mean"] != init["mean"]


def test_refuses_what_it_cannot_measure(trained_run):
    _, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    for change in ({"attn_type": "flash"}, {"causal": False}, {"quantize_queries": True}):
        with pytest.raises(ValueError, match="attn_type|quantized queries"):
            check_measurable(run_cfg.model.replace(**change))
