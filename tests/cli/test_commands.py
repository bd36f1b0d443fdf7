"""Commands: what a command cannot do is said before it does anything (a resume that would train nothing, an
unknown device or command, missing arguments), through the real entry point where its exit status matters."""

from __future__ import annotations

import json

import pytest
import torch

from cliutil import error_line, tiny_train, tvq

from transformer_vq.cli import main

def test_resume_with_steps_below_the_run(capsys, corpus, finished_run):
    argv = tiny_train(corpus, finished_run, "--resume", "auto", "--steps", "1")
    assert error_line(capsys, argv) == (
        f"error: --steps: the run in {finished_run} is already at step 2 and --steps is 1; give --steps 2 to finish "
        f"it as it is, or above 2 to train further")


def test_resume_of_a_finished_run_finishes_it_again(capsys, corpus, finished_run):
    """A run killed after the save of its last step lacks its end (the final report, the sample); resuming it
    runs that end and exits 0, and the metrics keep one line per step and validation."""
    metrics = (finished_run / "metrics.jsonl").read_text()
    assert main(tiny_train(corpus, finished_run, "--resume", "auto")) == 0
    out = capsys.readouterr().out
    assert "the run is at its last step (2): nothing to train; the end of the run follows" in out
    assert "done: 2 steps" in out and "validation" in out
    assert (finished_run / "metrics.jsonl").read_text() == metrics


def test_fresh_training_on_a_finished_run(capsys, corpus, finished_run):
    assert error_line(capsys, tiny_train(corpus, finished_run, "--steps", "3")) == (
        f"error: run directory {finished_run} already holds checkpoints; continue that run with --resume auto, or "
        f"start a new one with another --run-dir (or --name)")


def test_resume_with_another_architecture(capsys, corpus, finished_run):
    line = error_line(capsys, tiny_train(corpus, finished_run, "--resume", "--steps", "3", "--d-model", "64"))
    assert line == (f"error: checkpoint {finished_run}/checkpoints/step_00000002 is from a different architecture: "
                    f"d_model=32 (checkpoint) vs 64 (this run). Use the same model settings as the checkpoint (its "
                    f"config.json), or start a new run with another --run-dir")


@pytest.mark.parametrize("command", ["train", "eval", "sample"])
def test_unknown_device(capsys, command):
    assert error_line(capsys, [command, "--device", "tpu"]) == "error: --device: must be one of auto, cpu, cuda, " \
                                                               "got 'tpu'"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "eval", "sample"])
def test_cuda_without_a_gpu(capsys, trained, corpus, tmp_path, command):
    argv = tiny_train(corpus, tmp_path / "run") if command == "train" else [command, "--ckpt", str(trained)]
    assert error_line(capsys, [*argv, "--device", "cuda"]) == (
        "error: --device: cuda was requested but no CUDA GPU is available; use --device cpu (or auto)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_without_ckpt_and_no_default_run(capsys, tmp_path, command):
    assert error_line(capsys, [command]) == (
        "error: checkpoint path runs/default does not exist; pass a run directory (e.g. runs/default) or one of its "
        "checkpoints/step_* directories")


@pytest.mark.parametrize("argv, message", [
    (["nosuchcmd"], "error: argument COMMAND: invalid choice: 'nosuchcmd' (choose from 'version', 'doctor', "
                    "'demo', 'tokenizer', 'train', 'eval', 'sample', 'export', 'bench', 'classify', 'ablate', "
                    "'codebook'); see tvq --help"),
    (["bench"], "error: the following arguments are required: BENCH; see tvq bench --help"),
    (["bench", "op", "--lengths"], "error: --lengths: expected at least one argument"),
    (["train", "--steps"], "error: --steps: expected one argument (a negative value is written --steps=-X)"),
    (["train", "--bogus"], "error: unrecognized arguments: --bogus; see tvq train --help"),
], ids=["unknown-command", "bench-without-benchmark", "lengths-without-values", "flag-without-value",
        "unknown-flag-process"])
def test_real_entry_point(tmp_path, argv, message):
    proc = tvq(argv, cwd=tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, message + "\n", "")



def test_resume_with_a_preset_keeps_the_runs_training_fields(corpus, tmp_path):
    """--preset on a resume replaces the model's fields; the run's learning rate and clip stay (as tvq classify
    train --resume --preset keeps a classifier's: tests/test_recipes.py), and a flag still changes them."""
    run = tmp_path / "run"
    assert main(tiny_train(corpus, run, "--lr", "5e-3", "--grad-clip", "0.5")) == 0
    assert main(tiny_train(corpus, run, "--resume", "auto", "--steps", "3", "--grad-clip", "0.25")) == 0
    saved = json.loads((run / "config.json").read_text())["train"]
    assert (saved["lr"], saved["grad_clip"], saved["steps"]) == (5e-3, 0.25, 3)
