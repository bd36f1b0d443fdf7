"""The diagnostic of the carried context: evaluation with the state reset every ``carry_tokens``, and the profile by
position in block and by history, with the compressive cache on and off."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_vq.train import evaluate_tokens
from transformer_vq.train.lm.build import model_from_checkpoint
from transformer_vq.train.lm.context import context_profile, history_buckets, profile_tokens


def _tokens(run_cfg, n: int) -> np.ndarray:
    return np.frombuffer(open(run_cfg.train.data_path, "rb").read()[:n], dtype=np.uint8).astype(np.int64)


def test_history_buckets_double_from_two_blocks():
    assert history_buckets(1) == [(0, 2)]
    assert history_buckets(2) == [(0, 2)]
    assert history_buckets(9) == [(0, 2), (2, 4), (4, 8), (8, 16)]


def test_carry_tokens_resets_the_state_like_separate_sequences(trained_run):
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokens = _tokens(run_cfg, 241)  # 240 predictions: 7 whole pieces of 32 and one of 16
    x = torch.from_numpy(tokens)[None]  # (1, 241)
    with torch.no_grad():
        logits = torch.cat([model(x[:, i:min(i + 32, 240)]).logits for i in range(0, 240, 32)], dim=1)
    separate = F.cross_entropy(logits[0], x[0, 1:]).item()
    result = evaluate_tokens(model, tokens, window_len=8, streams=1, carry_tokens=32)
    # float32: only the windows' order of accumulation differs
    assert result.loss == pytest.approx(separate, rel=1e-5)
    assert abs(evaluate_tokens(model, tokens, window_len=8, streams=1).loss - separate) > 1e-4


def test_carry_tokens_must_be_whole_windows(trained_run):
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    with pytest.raises(ValueError) as error:
        evaluate_tokens(model, _tokens(run_cfg, 100), window_len=8, carry_tokens=12)
    assert str(error.value) == ("--carry-tokens 12 is not a multiple of the window length 8 (--window-len; by default "
                                "the run's update_len): give 8 or 16, or a --window-len that divides 12")
    with pytest.raises(ValueError, match="give 8, or"):  # below one window: only the next multiple is suggested
        evaluate_tokens(model, _tokens(run_cfg, 100), window_len=8, carry_tokens=5)


@pytest.mark.parametrize("carry", [0, 24], ids=["carry-all", "carry-24"])
def test_profile_totals_equal_the_evaluation(trained_run, carry):
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokens, L = _tokens(run_cfg, 203), run_cfg.model.block_len
    profile = profile_tokens(model, tokens, window_len=8, block_len=L, carry_tokens=carry, streams=3)
    result = evaluate_tokens(model, tokens, window_len=8, streams=3, carry_tokens=carry)
    assert profile["tokens"] == result.tokens == 202
    assert profile["bpb"] == pytest.approx(result.bits_per_byte, rel=1e-9)  # the same float64 sums, regrouped
    assert len(profile["by_phase"]) == L
    history = profile["by_history"]
    assert sum(b["tokens"] for b in history) == 202
    mean = sum(b["bpb"] * b["tokens"] for b in history) / 202
    assert mean == pytest.approx(result.bits_per_byte, rel=1e-9)
    if carry:  # no query has more than 24 tokens (3 blocks of 8) of history
        assert max(b["blocks"][0] for b in history) < 3


def test_without_history_beyond_the_window_the_cache_changes_nothing(trained_run):
    """Reset every two blocks, no key is ever older than a query's window: the cache is empty, on or off."""
    _, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    assert run_cfg.model.attn_type == "vq" and run_cfg.model.compressive_cache
    L = run_cfg.model.block_len
    rows = context_profile(str(trained_run), carry=(2 * L, 0), max_tokens=400, streams=1, window_len=L,
                           device="cpu")
    assert [(r["cache"], r["carry_tokens"]) for r in rows] == [(True, 2 * L), (True, 0), (False, 2 * L), (False, 0)]
    assert rows[0]["bpb"] == pytest.approx(rows[2]["bpb"], rel=1e-6)  # float32 rounding only
    assert abs(rows[1]["bpb"] - rows[3]["bpb"]) > 1e-4  # with the whole history the cache takes part


def test_evaluation_resets_at_the_trained_history_by_default(trained_run):
    """Training's validation and `tvq eval` reset the state every ``seq_len`` tokens, the history the model trained
    with (the authors' eval_op scans each sequence from a fresh state); ``--carry-tokens 0`` carries it across whole
    streams, and gives another figure once a stream is longer than ``seq_len``."""
    from transformer_vq.train import evaluate

    _, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    seq_len = run_cfg.train.seq_len  # 32 in the tiny runs
    default = evaluate(str(trained_run), max_tokens=512, streams=2)
    assert default.carry_tokens == seq_len
    assert default.loss == evaluate(str(trained_run), max_tokens=512, streams=2, carry_tokens=seq_len).loss
    whole = evaluate(str(trained_run), max_tokens=512, streams=2, carry_tokens=0)
    assert whole.carry_tokens == 0 and whole.loss != default.loss
    # the run's own final validation (eval_tokens 512, eval_streams 2) reads the same windows of update_len as
    # tvq eval (not whole seq_len windows: their memory grew several-fold with the codebook), so the same figure
    logged = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()
              if '"eval"' in line][-1]
    assert logged["carry_tokens"] == seq_len
    assert logged["loss"] == default.loss


def test_a_window_that_does_not_divide_seq_len_names_both_ways_out(trained_run):
    from transformer_vq.train import evaluate

    with pytest.raises(ValueError, match=r"--window-len 24 does not divide the run's seq_len 32.*--carry-tokens"):
        evaluate(str(trained_run), max_tokens=512, window_len=24)
    assert evaluate(str(trained_run), max_tokens=512, window_len=24, carry_tokens=0).carry_tokens == 0


def test_training_validation_reads_the_windows_tvq_eval_reads(corpus_file, tmp_path, monkeypatch):
    """Windows of update_len with the state reset every seq_len, as ``tvq eval``'s defaults: whole seq_len windows
    on every stream at once gave the same figure at several times the memory (2.96 vs 0.86 GB peak, `small` preset,
    whole Shakespeare split)."""
    import transformer_vq.train.lm.trainer as lm_trainer
    from trainutil import tiny_config

    from transformer_vq.train import train

    seen, real = [], lm_trainer.evaluate_tokens

    def spy(*args, **kwargs):
        seen.append((kwargs["window_len"], kwargs["carry_tokens"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_trainer, "evaluate_tokens", spy)
    cfg = tiny_config(corpus_file, tmp_path / "run", "steps=2", "eval_every=2")
    assert cfg.train.seq_len > cfg.train.update_len  # the two would be indistinguishable otherwise
    assert train(cfg).exit_code == 0
    assert seen and set(seen) == {(cfg.train.update_len, cfg.train.seq_len)}
