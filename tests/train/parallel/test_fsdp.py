"""FSDP2 (``--parallel fsdp``): 2 sharded gloo workers train the same model as 1 plain process, one
FSDP process is bit for bit the plain process, and an FSDP run's sharded checkpoint serves
``tvq eval`` through a plain model. A DDP checkpoint resumes under FSDP and the reverse."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
import torch

from trainutil import cli_args, final_weights, read_metrics, rewind, tiny_config, torchrun
from transformer_vq import fileio
from transformer_vq.cli import main
from transformer_vq.config.choices import OPTIMIZERS
from transformer_vq.config.train import FSDP_ADAFACTOR
from transformer_vq.train import CheckpointError, ConfigError, TrainConfig, evaluate, train
from transformer_vq.train.checkpoint import latest_checkpoint
from transformer_vq.train.parallel.fsdp import mixed_precision

EXTRA = ("steps=6", "ckpt_every=3", "batch_size=4")
FSDP_OPTIMIZERS = ("adamw",)
"""The optimizers the tests above train under FSDP."""


@pytest.fixture(scope="module")
def plain(corpus_file, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    train(tiny_config(corpus_file, run_dir, *EXTRA))
    return run_dir


@pytest.fixture(scope="module")
def fsdp_one(corpus_file, tmp_path_factory):
    """One FSDP process, without torchrun (a process group of one)."""
    run_dir = tmp_path_factory.mktemp("fsdp1") / "run"
    train(tiny_config(corpus_file, run_dir, *EXTRA, "parallel=fsdp"))
    return run_dir


def test_one_fsdp_process_is_the_plain_process_bitwise(plain, fsdp_one):
    """With one worker the shards are whole tensors and the reduce-scatter a copy: nothing changes."""
    assert [(r["loss"], r["grad_norm"]) for r in read_metrics(fsdp_one)] == \
        [(r["loss"], r["grad_norm"]) for r in read_metrics(plain)]
    assert latest_checkpoint(fsdp_one / "checkpoints").sharded
    assert not (latest_checkpoint(fsdp_one / "checkpoints").path / "model.safetensors").exists()
    mine, reference = final_weights(fsdp_one), final_weights(plain)
    assert mine.keys() == reference.keys()
    for name in reference:
        assert torch.equal(mine[name], reference[name]), name
    # eval reads the sharded checkpoint into a plain model: the same weights, the same numbers
    assert evaluate(str(fsdp_one), max_tokens=512).loss == evaluate(str(plain), max_tokens=512).loss


def test_two_fsdp_workers_match_one_process(plain, corpus_file, tmp_path):
    run_dir = tmp_path / "two"
    proc = torchrun([*cli_args(corpus_file, run_dir, *EXTRA), "--parallel", "fsdp"])
    assert "on 2 x cpu" in proc.stdout
    assert sorted(p.name for p in latest_checkpoint(run_dir / "checkpoints").path.iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "config.json", "manifest.json", "state.pt"]

    # Each worker's loss is the mean over its half of the batch and the gradient shards are averaged
    # by a reduce-scatter: the same sums as one process, in another order (float32, ~1e-7 relative;
    # measured at most 2e-7). The gradient norm is the global one (per shard it would be ~1/sqrt(2)).
    for a, b in zip(read_metrics(plain), read_metrics(run_dir), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) < 2e-6 * abs(a["grad_norm"]), (a, b)
    one, two = final_weights(plain), final_weights(run_dir)
    assert one.keys() == two.keys()
    for name in one:
        # as under DDP (test_ddp.py): Adam turns the rounding noise of tiny gradients into visible
        # relative changes of w_r's update; elsewhere the weights agree to ~1e-7
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-4, msg=name)
    # the codebooks moved and agree: their statistics were all-reduced as under DDP
    assert not torch.equal(one["units.0.quantizer.ema_count"], torch.ones_like(one["units.0.quantizer.ema_count"]))
    torch.testing.assert_close(two["units.0.quantizer.ema_sum"], one["units.0.quantizer.ema_sum"], rtol=0, atol=1e-5)

    # tvq eval of the 2-worker run: its shards joined into one plain model
    assert evaluate(str(run_dir), max_tokens=512).loss == pytest.approx(
        evaluate(str(plain), max_tokens=512).loss, rel=1e-5)


@pytest.mark.parametrize("saved_by, parallel", [("plain", "fsdp"), ("fsdp_one", "ddp")])
def test_a_run_moves_between_ddp_and_fsdp(request, corpus_file, tmp_path, saved_by, parallel):
    """A replicated checkpoint (whole tensors, Adam's moments by parameter position) resumes under FSDP and a
    sharded one (shards by parameter name) under DDP or one process; once refused (helper-73 audit-dist2 F4). One
    FSDP process is the plain process bit for bit (above), so the resumed steps are the uninterrupted run's."""
    source = request.getfixturevalue(saved_by)
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    rewind(run_dir, 3)
    train(tiny_config(corpus_file, run_dir, *EXTRA, f"parallel={parallel}"), resume="auto")
    resumed = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run_dir) if r["step"] > 3]
    assert resumed == [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(source) if r["step"] > 3]
    assert len(resumed) == 3
    mine, reference = final_weights(run_dir), final_weights(source)
    assert mine.keys() == reference.keys()
    for name in reference:
        assert torch.equal(mine[name], reference[name]), name
    assert latest_checkpoint(run_dir / "checkpoints").sharded == (parallel == "fsdp")


def test_bfloat16_gathers_bfloat16_and_keeps_float32_masters(corpus_file, tmp_path):
    policy = mixed_precision("bfloat16")
    assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (torch.bfloat16, torch.float32,
                                                                                     False)
    assert mixed_precision("float32") is None
    run_dir = tmp_path / "bf16"
    train(tiny_config(corpus_file, run_dir, "steps=2", "parallel=fsdp", "precision=bfloat16"))
    assert all(r["loss"] is not None and not r["skipped"] for r in read_metrics(run_dir))
    assert {t.dtype for t in final_weights(run_dir).values()} == {torch.float32}


class _RunsCode:
    def __reduce__(self):
        return (os.getpid, ())


def test_tampered_index_is_refused_before_running_code(fsdp_one, tmp_path):
    """DCP would unpickle .metadata with plain pickle; ours allows only DCP's metadata classes, even when
    the manifest was rewritten to match the tampered file."""
    run_dir = tmp_path / "tampered"
    shutil.copytree(fsdp_one, run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints").path
    (ckpt / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    fileio.write_dir_manifest(ckpt, [p.name for p in ckpt.iterdir() if p.name != fileio.DIR_MANIFEST])
    with pytest.raises(CheckpointError) as err:
        evaluate(str(run_dir), max_tokens=64)
    assert f"refusing to load {ckpt}: its .metadata names posix.getpid, which a DCP index never holds" in str(err.value)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_runs_under_fsdp_or_is_refused_when_the_config_is_read(optimizer, capsys):
    """adamw runs under FSDP (the tests above); any other optimizer must be refused before a worker starts, with
    the reason, or be added to FSDP_OPTIMIZERS with a test of its own."""
    if optimizer in FSDP_OPTIMIZERS:
        assert TrainConfig(optimizer=optimizer, parallel="fsdp").optimizer == optimizer
        return
    with pytest.raises(ConfigError) as caught:
        TrainConfig(optimizer=optimizer, parallel="fsdp")
    assert caught.value.problems == (("optimizer", FSDP_ADAFACTOR),)
    assert main(["train", "--parallel", "fsdp", "--optimizer", optimizer]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --optimizer: 'adafactor' does not run with parallel 'fsdp': its factored second moment updates "
        "statistics of whole rows and columns of each matrix in place, which FSDP shards across workers (PyTorch "
        "refuses such in-place updates of sharded tensors); use --optimizer adamw with --parallel fsdp, or "
        "--parallel ddp with adafactor")
