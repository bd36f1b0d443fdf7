"""Bad input gives one specific message that names the problem and the fix, exit code 2, no traceback."""

from __future__ import annotations

import os

import pytest

from transformer_vq.cli import main
from transformer_vq.config.load import RESUME_HINT


def run_train(capsys, *sets: str, preset: str = "tiny") -> str:
    """Run `tvq train` in-process; return stderr after checking the exit code and that no traceback shows."""
    args = ["train", "--preset", preset, "--set", "seq_len=32", "--set", "update_len=16", "--set", "batch_size=4"]
    for item in sets:
        args += ["--set", item]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err.strip()


def test_missing_data_path(capsys, tmp_path):
    err = run_train(capsys, "data=text", f"data_path={tmp_path / 'nope.txt'}")
    assert err == (f"error: data path {tmp_path / 'nope.txt'} does not exist; pass --data-path with an existing "
                   f"text file or directory")


def test_unreadable_data_path(capsys, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    err = run_train(capsys, "data=text", f"data_path={fifo}")
    assert err == f"error: data path {fifo} is neither a regular file nor a directory; pass a text file or directory"


def test_text_without_data_path(capsys):
    assert run_train(capsys, "data=text") == ("error: --data text needs a file or directory: "
                                              "pass --data-path FILE_OR_DIR")


def test_empty_corpus(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    err = run_train(capsys, "data=text", f"data_path={empty}")
    assert err.startswith(f"error: text ({empty}) is too short to split: 0 tokens")
    assert "Use a corpus of at least" in err


def test_corpus_too_short_for_a_batch(capsys, corpus_file, tmp_path):
    err = run_train(capsys, "data=text", f"data_path={corpus_file}", "batch_size=64", "seq_len=512",
                    f"run_dir={tmp_path / 'run'}")
    n_train = round(corpus_file.stat().st_size * 0.9)
    assert err == (f"error: the train split has {n_train} tokens, too short for one batch of 64 sequences of 512 "
                   f"tokens (needs at least 32769); use more data or lower batch_size / seq_len")


def test_tokens_outside_the_vocabulary(capsys, corpus_file, tmp_path):
    err = run_train(capsys, "data=text", f"data_path={corpus_file}", "model.vocab_size=100",
                    f"run_dir={tmp_path / 'run'}")
    top = max(corpus_file.read_bytes()[: round(corpus_file.stat().st_size * 0.9)])
    assert err == (f"error: the train split contains token id {top}, outside the model's vocabulary [0, 100); set "
                   f"model vocab_size to at least {top + 1} (--set model.vocab_size={top + 1}) or fix the data")


def test_unknown_config_key(capsys):
    err = run_train(capsys, "learning_rate=1e-3")
    assert err.startswith("error: unknown config key(s): learning_rate; known keys: abs_pos, attn_backend, attn_type, "
                          "batch_size")
    err = run_train(capsys, "model.dmodel=64")
    assert err.startswith("error: unknown model config key(s): dmodel; known keys: abs_pos, attn_backend, attn_type, "
                          "bias_span, block_len")


@pytest.mark.parametrize("item, message", [
    ("steps=ten", "error: --steps: must be an integer, got 'ten'"),
    ("steps=0", "error: --steps: must be a positive integer, got '0'"),
    ("optimizer=sgd", "error: --optimizer: must be one of adamw, adafactor, got 'sgd'"),
    ("model.d_model=31", "error: --d-model: must be even (sinusoid tables pair sin and cos), got 31"),
])
def test_bad_values(capsys, item, message):
    assert run_train(capsys, item) == message


def test_seq_len_not_a_multiple_of_update_len(capsys):
    assert run_train(capsys, "seq_len=40") == "error: --seq-len: must be a multiple of update_len=16 (e.g. 32), got 40"


def test_update_len_not_a_multiple_of_block_len(capsys):
    assert run_train(capsys, "update_len=12", "seq_len=36") == (
        "error: --update-len: must be a multiple of the model's block_len=8 (e.g. 8, or change block_len), got 12")


def test_missing_checkpoint_for_eval_and_sample(capsys, tmp_path):
    for command in ("eval", "sample"):
        assert main([command, "--ckpt", str(tmp_path / "nowhere")]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: checkpoint path {tmp_path / 'nowhere'} does not exist; pass a run directory (e.g. runs/default) "
            f"or one of its checkpoints/step_* directories")


def test_resume_with_steps_below_the_saved_step(capsys, trained_run):
    # trained_run stopped at step 6 (conftest)
    assert main(["train", "--resume", "auto", "--run-dir", str(trained_run), "--steps", "3"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --steps: the run in {trained_run} is already at step 6 and --steps is 3; give --steps 6 to "
        f"finish it as it is, or above 6 to train further")


def test_corrupted_run_config(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"model": {"d_model": 32,')
    assert main(["train", "--resume", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {run_dir / 'config.json'} is not a run's saved config (config.json): invalid JSON at line "
                   f"1, column 26 (Expecting property name enclosed in double quotes); {RESUME_HINT}")
