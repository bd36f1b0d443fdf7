"""`tvq eval` of an encoder: independent windows of --window-len tokens, each masked by its own index, so that the
score does not depend on --streams (how many windows share a forward call); --carry-tokens, which resets a state an
encoder does not have, is refused."""

from __future__ import annotations

import pytest

from trainutil import tiny_config
from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.train import evaluate, train


@pytest.fixture(scope="module")
def encoder_run(corpus_file, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("encoder") / "run"
    assert train(tiny_config(corpus_file, run_dir, "steps=2", "model.causal=false")).exit_code == 0
    return run_dir


def test_streams_change_nothing(encoder_run):
    """The same windows, masked the same way, batched 1, 3 or 4 at a time (the last batch partial): the same masked
    tokens, and the same loss up to float rounding (a batch of windows is one matmul: its sums may round
    differently)."""
    one, three, four = (evaluate(str(encoder_run), max_tokens=600, streams=n) for n in (1, 3, 4))
    assert one.tokens == three.tokens == four.tokens
    assert three.bits_per_byte == pytest.approx(one.bits_per_byte, rel=1e-6)
    assert four.bits_per_byte == pytest.approx(one.bits_per_byte, rel=1e-6)


def test_window_len_is_any_length(encoder_run):
    """An encoder has no state to reset at the run's seq_len (32), so a window that does not divide it is its
    context like any other; a causal model's default reset would refuse it."""
    result = evaluate(str(encoder_run), max_tokens=600, window_len=24)
    assert result.objective == "masked-token" and result.carry_tokens == 0


def test_carry_tokens_refused(encoder_run, capsys):
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(encoder_run), "--max-tokens", "600", "--carry-tokens", "64"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --carry-tokens: applies only to causal models, and {encoder_run} holds an encoder (causal false), "
        f"which reads independent windows and carries no state to reset, got 64; leave it out (--window-len sets an "
        f"encoder's context)")
    with pytest.raises(ConfigError, match="carry_tokens"):  # 0 too: there is nothing to carry
        evaluate(str(encoder_run), max_tokens=600, carry_tokens=0)
