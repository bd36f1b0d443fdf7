"""`tvq train --arch longvq`: LongVQ's causal language model trains through the library's loop (commitment loss and
codebook metrics logged), carries its state across training windows, evaluation windows and a mid-batch resume bit
for bit, samples through its constant-size state, shards under FSDP, and is refused by `tvq export` by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainutil import final_weights, read_metrics, rewind, tiny_overrides
from transformer_vq.cli import main
from transformer_vq.config import load_config
from transformer_vq.data.codec import decode_bytes
from transformer_vq.models.longvq.model import LongVQLM
from transformer_vq.train import evaluate, evaluate_tokens, sample, train
from transformer_vq.train.checkpoint import latest_checkpoint
from transformer_vq.train.lm.build import model_from_checkpoint

# dropout on: a resume must restore the random streams too
EXTRA = ("steps=6", "ckpt_every=3", "model.dropout=0.1")


def longvq_config(corpus_file, run_dir, *extra):
    return load_config("tiny", overrides=tiny_overrides(corpus_file, run_dir, *EXTRA, *extra), arch="longvq")


@pytest.fixture(scope="module")
def longvq_run(corpus_file, tmp_path_factory):
    """A tiny LongVQ language model trained for 6 steps (2 windows per batch), read-only."""
    run_dir = tmp_path_factory.mktemp("longvq") / "run"
    result = train(longvq_config(corpus_file, run_dir, "sample_tokens=12"))
    assert result.exit_code == 0 and result.step == 6 and len(result.sample) > 0
    return run_dir


def test_the_run_trains_a_longvq_model_and_logs_its_codebook(longvq_run):
    saved = json.loads((longvq_run / "config.json").read_text())
    assert saved["arch"] == "longvq" and saved["model"]["d_qk"] == 16
    model, run_cfg, _ = model_from_checkpoint(str(longvq_run), device="cpu")
    assert isinstance(model, LongVQLM) and run_cfg.arch == "longvq"
    records = read_metrics(longvq_run)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        # the logged loss is eq. 23: cross-entropy plus 1e-4 times the commitment loss of the 2 layers
        assert r["commit_loss"] > 0 and abs(r["loss"] - (r["ce_loss"] + 1e-4 * r["commit_loss"])) < 1e-5
        assert 1.0 <= r["codebook_perplexity"] <= 8.0 and 0.0 <= r["codebook_unused"] < 1.0


def test_evaluation_carries_the_state_across_windows(longvq_run):
    """Any evaluation window gives the loss of one forward pass over the whole split (float32 rounding)."""
    model, run_cfg, _ = model_from_checkpoint(str(longvq_run), device="cpu")
    tokens = np.frombuffer(open(run_cfg.train.data_path, "rb").read()[:61], dtype=np.uint8).astype(np.int64)
    with torch.no_grad():
        x = torch.from_numpy(tokens)[None]  # (1, 61)
        whole = F.cross_entropy(model(x[:, :-1]).logits[0], x[0, 1:]).item()
    for window in (1, 5, 8, 60):
        assert abs(evaluate_tokens(model, tokens, window_len=window).loss - whole) < 1e-5, window
    result = evaluate(str(longvq_run), max_tokens=200)
    assert result.tokens == 199 and result.objective == "next-token"


def test_greedy_sample_follows_the_argmax_of_the_full_forward(longvq_run):
    """`sample` decodes token by token through the carried state: the same tokens as the whole-sequence argmax."""
    model, _, _ = model_from_checkpoint(str(longvq_run), device="cpu")
    prompt = torch.tensor([list(b"the king")])
    ids = model.generate(prompt, 6, temperature=0.0)  # (1, 14)
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits
    assert ids[0, 8:].tolist() == logits[0, 7:].argmax(-1).tolist()
    text = "".join(sample(str(longvq_run), "the king", max_new_tokens=6, temperature=0.0))
    assert text == decode_bytes(ids[0, 8:].tolist())


def test_a_mid_batch_resume_continues_bit_for_bit(longvq_run, corpus_file, tmp_path):
    """Step 3 falls in the middle of a batch: the carried SSM and attention states are restored with the rest."""
    run_dir = tmp_path / "run"
    shutil.copytree(longvq_run, run_dir)
    rewind(run_dir, 3)
    assert train(longvq_config(corpus_file, run_dir, "sample_tokens=12"), resume="auto").step == 6
    assert [r["loss"] for r in read_metrics(run_dir)] == [r["loss"] for r in read_metrics(longvq_run)][3:]
    mine, reference = final_weights(run_dir), final_weights(longvq_run)
    assert all(torch.equal(mine[name], reference[name]) for name in reference)


def test_one_fsdp_process_trains_the_same_longvq_model(longvq_run, corpus_file, tmp_path):
    run_dir = tmp_path / "fsdp"
    train(longvq_config(corpus_file, run_dir, "sample_tokens=12", "parallel=fsdp"))
    assert [r["loss"] for r in read_metrics(run_dir)] == [r["loss"] for r in read_metrics(longvq_run)]


def test_the_command_line_trains_evaluates_and_samples(corpus_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "--arch", "longvq", "--preset", "tiny", "--d-qk", "8", "--ema-dim", "2", "--norm", "scale"]
    for item in tiny_overrides(corpus_file, run_dir, "steps=2"):
        argv += ["--set", item]
    assert main(argv) == 0
    assert "tvq sample --ckpt" in capsys.readouterr().out
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["arch"], saved["model"]["d_qk"], saved["model"]["ema_dim"], saved["model"]["norm"]) == \
        ("longvq", 8, 2, "scale")
    assert main(["eval", "--ckpt", str(run_dir), "--max-tokens", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 99
    assert main(["sample", "--ckpt", str(run_dir), "--prompt", "the", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the")
    # resuming continues the saved LongVQ config (a training-only field may change); the other architecture is refused
    assert main(["train", "--resume", "auto", "--run-dir", str(run_dir), "--steps", "3", "--dropout", "0.2"]) == 0
    assert json.loads((run_dir / "config.json").read_text())["model"]["dropout"] == 0.2
    assert main(["train", "--resume", "auto", "--run-dir", str(run_dir), "--steps", "4", "--arch", "tvq"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --arch: the run being resumed trained a 'longvq' model, not 'tvq'; leave --arch out to continue it, "
        "or start a new run with another --run-dir")


def test_a_transformer_vq_model_cannot_resume_a_longvq_checkpoint(longvq_run, corpus_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(longvq_run, run_dir)
    argv = ["train", "--resume", "auto", "--preset", "tiny", "--arch", "tvq"]  # the preset replaces the model
    for item in tiny_overrides(corpus_file, run_dir, "steps=8"):
        argv += ["--set", item]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: checkpoint {run_dir / 'checkpoints' / 'step_00000006'} holds another kind of model than this run "
        f"builds (its fields d_ffn, d_qk, dropout, ema_dim, ema_timescale, n_classes, norm, scoring are not this "
        f"model's). Use the architecture of the checkpoint (its config.json), or start a new run with another "
        f"--run-dir")


def test_export_refuses_a_longvq_run(longvq_run, tmp_path, capsys):
    assert main(["export", "--ckpt", str(longvq_run), "--out", str(tmp_path / "out"), "--format", "safetensors"]) == 2
    step = latest_checkpoint(longvq_run / "checkpoints").path
    assert capsys.readouterr().err == (
        f"error: --ckpt: {step} holds a LongVQ causal language model (SSM and gated VQ attention) (a run of tvq train "
        f"--arch longvq), and tvq export reads a Transformer-VQ language model (tvq train --arch tvq); for this run "
        f"use tvq codebook, tvq eval, tvq sample\n")
    assert not (tmp_path / "out").exists()
