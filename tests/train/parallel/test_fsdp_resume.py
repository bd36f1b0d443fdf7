"""Resuming FSDP runs from their sharded checkpoints: after SIGKILL bit for bit, on the same number of
workers mid-batch bit for bit, and on another number of workers (2 -> 1, 1 -> 2), where DCP reslices
the weights and the Adam moments and only the summation order of the gradients changes."""

from __future__ import annotations

import shutil

import pytest
import torch

from trainutil import (cli_args, final_weights, kill_after_checkpoint, read_metrics, rewind, tiny_config, torchrun,
                       tvq_process)
from transformer_vq.train import train

# checkpoints at steps 3 (the middle of a batch of 2 windows), 6 (a batch boundary) and 8
EXTRA = ("steps=8", "ckpt_every=3", "keep_ckpts=5", "batch_size=4", "parallel=fsdp")


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def assert_weights_close(got: dict, expected: dict, atol: float) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def two(corpus_file, tmp_path_factory):
    """An uninterrupted 2-worker FSDP run."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    torchrun(cli_args(corpus_file, run_dir, *EXTRA))
    return run_dir


@pytest.fixture(scope="module")
def one(corpus_file, tmp_path_factory):
    """An uninterrupted 1-worker FSDP run (no torchrun)."""
    run_dir = tmp_path_factory.mktemp("one") / "run"
    train(tiny_config(corpus_file, run_dir, *EXTRA))
    return run_dir


def test_two_workers_resume_mid_batch_bitwise(two, tmp_path):
    """Each worker's shards, its carried state and its RNG come back: steps 4-8 are identical."""
    run_dir = tmp_path / "run"
    shutil.copytree(two, run_dir)
    rewind(run_dir, 3)
    proc = torchrun(["train", "--resume", "auto", "--run-dir", str(run_dir)])
    assert "at step 3" in proc.stdout
    assert losses(run_dir) == {step: loss for step, loss in losses(two).items() if step > 3}
    expected, got = final_weights(two), final_weights(run_dir)
    assert_weights_close(got, expected, atol=0.0)


def test_two_worker_run_resumes_on_one(two, corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(two, run_dir)
    rewind(run_dir, 6)
    result = train(tiny_config(corpus_file, run_dir, *EXTRA), resume="auto")
    assert result.step == 8
    reference = losses(two)
    # one worker sums the whole batch's gradient at once: float32 summation order only (~1e-7)
    for step, loss in losses(run_dir).items():
        assert step in (7, 8) and abs(loss - reference[step]) < 1e-6 * abs(loss), (step, loss, reference[step])
    assert_weights_close(final_weights(run_dir), final_weights(two), atol=1e-5)


def test_one_worker_run_resumes_on_two(one, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one, run_dir)
    rewind(run_dir, 6)
    proc = torchrun(["train", "--resume", "auto", "--run-dir", str(run_dir)])
    assert "at step 6" in proc.stdout and "on 2 x cpu" in proc.stdout
    reference = losses(one)
    for step, loss in losses(run_dir).items():
        assert step in (7, 8) and abs(loss - reference[step]) < 1e-6 * abs(loss), (step, loss, reference[step])
    assert_weights_close(final_weights(run_dir), final_weights(one), atol=1e-5)


KILL_EXTRA = ("steps=60", "ckpt_every=7", "keep_ckpts=2", "model.dropres=0.1", "model.dropsin=0.1",
              "parallel=fsdp")


def test_sigkill_then_resume_is_bitwise(corpus_file, tmp_path):
    """A one-worker FSDP run killed after a mid-batch checkpoint resumes exactly (dropout on: the
    RNG states matter; the Adam moments come back from the shards)."""
    reference = tmp_path / "reference"
    train(tiny_config(corpus_file, reference, *KILL_EXTRA))
    run_dir = tmp_path / "killed"
    proc = tvq_process(cli_args(corpus_file, run_dir, *KILL_EXTRA))
    resumed_from = kill_after_checkpoint(proc, run_dir, 21)
    assert 21 <= resumed_from < 60

    proc = tvq_process(["train", "--resume", "auto", "--run-dir", str(run_dir)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"at step {resumed_from}" in out
    expected = losses(reference)
    for record in read_metrics(run_dir):  # steps logged before the kill and again after it: all equal
        assert record["loss"] == expected[record["step"]], record
    assert_weights_close(final_weights(run_dir), final_weights(reference), atol=0.0)
