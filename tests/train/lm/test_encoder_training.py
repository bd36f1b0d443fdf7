"""Training the other members of the family through `tvq train`: an encoder by masked-token prediction, and a model
whose queries are quantized too. Both learn, checkpoint and resume bit for bit; an encoder refuses to sample."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from trainutil import read_metrics, tiny_config
from transformer_vq.cli import main
from transformer_vq.train import evaluate, train
from transformer_vq.train.checkpoint import latest_checkpoint

ENCODER = ("model.causal=false",)
QK = ("model.quantize_queries=true",)


def weights(run_dir):
    return load_file(str(latest_checkpoint(run_dir / "checkpoints").path / "model.safetensors"))


@pytest.mark.parametrize("variant", [ENCODER, QK, ENCODER + QK], ids=["encoder", "qk", "encoder-qk"])
def test_trains_and_lowers_its_loss(corpus_file, tmp_path, variant):
    result = train(tiny_config(corpus_file, tmp_path / "run", "steps=40", "eval_tokens=2048", "log_every=1", *variant))
    losses = [r["ce_loss"] for r in read_metrics(tmp_path / "run") if "ce_loss" in r]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    expected = "masked-token" if "model.causal=false" in variant else "next-token"
    assert result.validation.objective == expected and result.validation.bits_per_byte < 8


@pytest.mark.parametrize("variant", [ENCODER, QK], ids=["encoder", "qk"])
def test_resumed_run_equals_uninterrupted_bit_for_bit(corpus_file, tmp_path, variant):
    """A run stopped at step 3 (mid-batch: two windows a batch) and resumed equals one run of 6 steps: the masks of
    an encoder's windows are drawn from (seed, step, worker), so the resumed steps mask the same tokens."""
    train(tiny_config(corpus_file, tmp_path / "whole", "steps=6", *variant))
    train(tiny_config(corpus_file, tmp_path / "split", "steps=3", "ckpt_every=3", *variant))
    train(tiny_config(corpus_file, tmp_path / "split", "steps=6", *variant), resume="auto")
    whole, split = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.equal(whole[name], split[name]), name


def test_encoder_eval_counts_masked_bytes_and_sample_refuses(corpus_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(tiny_config(corpus_file, run_dir, "steps=2", *ENCODER))
    capsys.readouterr()
    first = evaluate(str(run_dir), max_tokens=600)
    assert first.objective == "masked-token" and 40 < first.tokens < 150  # ~15% of 600 tokens
    again = evaluate(str(run_dir), max_tokens=600)
    assert (again.loss, again.tokens) == (first.loss, first.tokens)  # the same masks every time
    assert main(["eval", "--ckpt", str(run_dir), "--max-tokens", "600"]) == 0
    assert "bits per masked byte over" in capsys.readouterr().out
    assert main(["eval", "--ckpt", str(run_dir), "--max-tokens", "600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] == "masked-token"
    code = main(["sample", "--ckpt", str(run_dir)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (f"error: --ckpt: {run_dir} holds an encoder (causal false), which "
                                               f"predicts masked tokens from both sides and cannot generate; score it "
                                               f"with tvq eval --ckpt {run_dir}")
