"""``tvq train --context-parallel N`` under torchrun (gloo, CPU): the workers of a "cp" row read the same sequences,
each a chunk of every window, and train the model a single process trains on the whole windows (same losses, gradient
norms, weights and codebooks, to float32 rounding), under DDP and under FSDP2 sharded over the whole mesh."""

from __future__ import annotations

import pytest
import torch

from trainutil import cli_args, final_weights, read_metrics, tiny_config, torchrun
from transformer_vq.train import train

EXTRA = ("steps=4", "ckpt_every=100", "batch_size=2")


@pytest.fixture(scope="module")
def plain(corpus_file, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    train(tiny_config(corpus_file, run_dir, *EXTRA))
    return run_dir


@pytest.mark.parametrize("nproc,options", [(2, ()), (2, ("--parallel", "fsdp")), (4, ("--parallel", "fsdp"))],
                         ids=["cp2-ddp", "cp2-fsdp", "dp2xcp2-fsdp"])
def test_context_parallel_trains_as_one_process(plain, corpus_file, tmp_path, nproc, options):
    run_dir = tmp_path / "cp"
    proc = torchrun([*cli_args(corpus_file, run_dir, *EXTRA), "--context-parallel", "2", *options], nproc=nproc)
    assert f"on {nproc} x cpu (context parallel 2)" in proc.stdout
    # float32: the chunk losses are averaged and the gradients reduced over workers, the cache merged in another
    # order: the same sums as one process in another order (~1e-7 relative)
    for a, b in zip(read_metrics(plain), read_metrics(run_dir), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * abs(a["grad_norm"]), (a, b)
    mine, reference = final_weights(run_dir), final_weights(plain)
    assert mine.keys() == reference.keys()
    for name in reference:
        # as in test_ddp: Adam turns summation-order noise of tiny gradients (w_r) into ~1e-5 of the update
        torch.testing.assert_close(mine[name], reference[name], rtol=0, atol=1e-4, msg=name)


def test_without_enough_workers_is_refused(corpus_file, tmp_path):
    with pytest.raises(ValueError) as err:
        train(tiny_config(corpus_file, tmp_path / "run", *EXTRA, "context_parallel=2"))
    assert str(err.value) == ("context_parallel 2 splits each sequence over that many torchrun workers, and this run "
                              "has 1: start it with torchrun --nproc_per_node set to a multiple of 2, or lower "
                              "--context-parallel")


@pytest.mark.parametrize("saved, resumed", [("1", "2"), ("2", "1")], ids=["ddp-then-cp2", "cp2-then-ddp"])
def test_a_mid_batch_checkpoint_resumes_under_another_context_parallelism(corpus_file, tmp_path, saved, resumed):
    """Each worker's carried state covers its rows of the batch: those of its whole group under context parallelism,
    its own under DDP. Resumed mid-batch with the other layout, the rest of the batch starts without context, as after
    a change of worker count (the state of the other layout crashed the first step)."""
    run_dir = tmp_path / "run"
    steps = ("ckpt_every=3", "batch_size=2")
    first = torchrun([*cli_args(corpus_file, run_dir, "steps=3", *steps), "--context-parallel", saved])
    assert first.returncode == 0, first.stderr
    proc = torchrun([*cli_args(corpus_file, run_dir, "steps=4", *steps), "--context-parallel", resumed,
                     "--resume", "auto"])
    assert proc.returncode == 0, proc.stderr
    assert "mid-batch" in proc.stdout and "the rest of this batch starts without context" in proc.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]


def test_a_mid_batch_checkpoint_of_context_parallel_workers_continues_its_carry_in_one_process(corpus_file, tmp_path,
                                                                                              capsys):
    """The ranks of a "cp" row carry the same state, the rows of their share of the batch: a mid-batch checkpoint of
    2 workers of one share goes on in one process with that state, as the run would have gone on (it restarted the
    batch's windows without context, keyed by worker count)."""
    run_dir, straight = tmp_path / "run", tmp_path / "straight"
    steps = ("ckpt_every=3", "batch_size=2")
    first = torchrun([*cli_args(corpus_file, run_dir, "steps=3", *steps), "--context-parallel", "2"])
    assert first.returncode == 0, first.stderr
    capsys.readouterr()
    train(tiny_config(corpus_file, run_dir, "steps=4", *steps), resume="auto")
    said = capsys.readouterr()
    assert "resumed from" in said.out + said.err and "without context" not in said.out + said.err, said
    train(tiny_config(corpus_file, straight, "steps=4", *steps))
    a, b = read_metrics(straight)[-1], read_metrics(run_dir)[-1]
    assert a["step"] == b["step"] == 4 and abs(a["loss"] - b["loss"]) < 1e-5 * abs(a["loss"]), (a, b)
