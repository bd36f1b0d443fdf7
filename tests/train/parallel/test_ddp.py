"""Data parallel: 2 gloo workers under torchrun train the same model as 1 process with the same
global batch (gradients averaged, codebook statistics summed, each worker reading its own shard)."""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from trainutil import cli_args, read_metrics, tiny_config, torchrun
from transformer_vq import TransformerVQ, preset
from transformer_vq.train import train
from transformer_vq.train.parallel.distributed import Distributed, data_parallel
from transformer_vq.train.checkpoint import latest_checkpoint

EXTRA = ("steps=6", "ckpt_every=100", "batch_size=4")


# An encoder (masked-token prediction) too: each row is masked from its index in the global batch, not from the
# worker, and every row masks equally many tokens, so the average of the workers' mean losses is one process's mean
# (once they differed from the first step).
# Packed documents (one per line) too: a document's first token is not predicted, so the workers score different
# numbers of targets; each weighs its mean by its share of them, so their average is one process's mean (once a mean
# of the workers' means, 6.3337 against 6.3209 at the first step).
@pytest.mark.parametrize("objective", [(), ("model.causal=false",), ("pack=true",)],
                         ids=["causal", "encoder", "packed"])
def test_two_workers_match_one_process(corpus_file, tmp_path, objective):
    one, two = tmp_path / "one", tmp_path / "two"
    cfg = tiny_config(corpus_file, one, *EXTRA, *objective)
    lines = ["--data-option", "lines=true"] if objective == ("pack=true",) else []
    if lines:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data_options={"lines": True}))
    train(cfg)
    assert "on 2 x cpu" in torchrun(cli_args(corpus_file, two, *EXTRA, *objective) + lines).stdout

    # per-step losses and gradient norms equal up to float32 summation order (~1e-7 relative); the
    # gradient norm shows the gradients are averaged (summed, it would double), the loss that each
    # worker read its own half of the batch
    for a, b in zip(read_metrics(one), read_metrics(two), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * abs(a["grad_norm"]), (a, b)
    w1 = load_file(str(latest_checkpoint(one / "checkpoints").path / "model.safetensors"))
    w2 = load_file(str(latest_checkpoint(two / "checkpoints").path / "model.safetensors"))
    assert w1.keys() == w2.keys()
    for name in w1:
        # Adam divides each gradient by its running RMS, so where gradients are tiny (the relative-
        # position projection w_r) summation-order noise becomes a visible relative error of the
        # update: measured up to ~3e-5 after six steps of at most lr = 3e-3 each (the encoder's w_r: 5e-4, with
        # losses equal to 1e-5); elsewhere ~1e-7
        tolerance = 1e-3 if objective and "w_r" in name else 1e-4
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=tolerance, msg=name)
    # the codebooks moved (EMA updates happened) and agree too
    assert not torch.equal(w1["units.0.quantizer.ema_count"], torch.zeros_like(w1["units.0.quantizer.ema_count"]))

    # resumed at its last step, the run ends again on both workers (only rank 0 validates under DDP)
    metrics = (two / "metrics.jsonl").read_text()
    out = torchrun(["train", "--resume", "auto", "--run-dir", str(two)]).stdout
    assert "the run is at its last step (6): nothing to train" in out and "done: 6 steps; validation" in out
    assert (two / "metrics.jsonl").read_text() == metrics


def test_two_workers_resume_mid_batch_bitwise(corpus_file, tmp_path):
    """Each worker's carried state and RNG (dropout on) are saved and restored: rewinding a 2-worker
    run to its mid-batch checkpoint at step 3 and resuming reproduces steps 4-8 exactly."""
    run_dir = tmp_path / "run"
    extra = ("steps=8", "ckpt_every=3", "keep_ckpts=5", "model.dropres=0.1")
    torchrun(cli_args(corpus_file, run_dir, *extra))
    reference = {r["step"]: r["loss"] for r in read_metrics(run_dir)}
    for later in ("step_00000006", "step_00000008"):
        shutil.rmtree(run_dir / "checkpoints" / later)
    (run_dir / "checkpoints" / "latest").write_text("step_00000003\n")
    (run_dir / "metrics.jsonl").write_text("")

    proc = torchrun(["train", "--resume", "auto", "--run-dir", str(run_dir)])
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout
    resumed = {r["step"]: r["loss"] for r in read_metrics(run_dir)}
    assert resumed == {step: reference[step] for step in range(4, 9)}


def test_the_process_group_ends_inside_the_teardown(corpus_file, tmp_path):
    """The root of a hang at exit seen in CI: DDP's C++ reducer held the gloo process group after
    ``destroy_process_group``, so the group was destroyed when the trainer was freed, holding the GIL while it joined
    a gloo thread that needed the GIL. The trainer now drops its DDP wrapper first: the group, and its threads, end
    inside the teardown (whose release of the group lets go of the GIL), whatever still holds the trainer."""
    worker = Path(__file__).with_name("teardown_worker.py")
    out = torchrun([str(corpus_file), str(tmp_path / "run")], entry=(str(worker),)).stdout
    assert out.count("gloo threads left after the teardown: []") == 2, out


def test_the_ddp_wrapper_warns_nothing():
    """DDP's wrapper is built with the option's current name: torch 2.13 renamed ``broadcast_buffers`` and warned on
    every worker of every run."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            wrapped = data_parallel(TransformerVQ(preset("tiny")), dataclasses.replace(Distributed(), world_size=2),
                                    torch.device("cpu"), find_unused=False)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        del wrapped
    finally:
        dist.destroy_process_group()
