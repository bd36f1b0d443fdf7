"""Training on CUDA: ``tvq train --device cuda`` in bfloat16 autocast (and compiled), then ``tvq eval`` and
``tvq sample`` of its checkpoint; one FSDP process and a DDP wrapper over nccl; two DDP workers when two GPUs exist.

Run with ``python -m pytest -m gpu tests/gpu`` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.distributed as dist

from trainutil import cli_args, read_metrics, tiny_config, torchrun
from transformer_vq import TransformerVQ, preset
from transformer_vq.cli import main
from transformer_vq.train import evaluate, train
from transformer_vq.train.checkpoint import latest_checkpoint
from transformer_vq.train.parallel.distributed import Distributed, data_parallel

pytestmark = pytest.mark.gpu

STEPS = ("steps=6", "ckpt_every=3", "batch_size=4")


def losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def cuda_run(corpus_file, tmp_path_factory):
    """A bfloat16 run of six steps on the GPU, through the command line (checkpoints at steps 3 and 6)."""
    run_dir = tmp_path_factory.mktemp("cuda") / "run"
    assert main([*cli_args(corpus_file, run_dir, *STEPS), "--device", "cuda", "--precision", "bfloat16"]) == 0
    return run_dir


def test_train_bfloat16_on_cuda(cuda_run, capsys):
    records = read_metrics(cuda_run)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and not r["skipped"] for r in records)
    assert latest_checkpoint(cuda_run / "checkpoints").step == 6
    # a run resumed on the GPU from its mid-batch checkpoint (carried state saved from the GPU) goes on
    assert main(["train", "--resume", "auto", "--run-dir", str(cuda_run), "--steps", "8", "--device", "cuda"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert latest_checkpoint(cuda_run / "checkpoints").step == 8


def test_eval_on_cuda_equals_cpu(cuda_run, capsys):
    assert main(["eval", "--ckpt", str(cuda_run), "--device", "cuda", "--max-tokens", "512", "--json"]) == 0
    on_gpu = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    on_cpu = evaluate(str(cuda_run), max_tokens=512, device="cpu")
    assert on_gpu["tokens"] == on_cpu.tokens == 511
    # the run's bfloat16 autocast on both devices: kernels that round differently, within bfloat16's 2^-8 steps
    assert abs(on_gpu["loss"] - on_cpu.loss) < 2e-2 * on_cpu.loss


def test_sample_on_cuda_is_reproducible(cuda_run, capsys):
    argv = ["sample", "--ckpt", str(cuda_run), "--device", "cuda", "--prompt", "the king", "--max-new-tokens", "40",
            "--seed", "3"]
    texts = []
    for _ in range(2):
        assert main(argv) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("the king") and len(texts[0]) > len("the king\n")


def test_compiled_training_on_cuda_equals_eager(corpus_file, tmp_path):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train(tiny_config(corpus_file, eager, *STEPS, "device=cuda"))
    train(tiny_config(corpus_file, compiled, *STEPS, "device=cuda", "torch_compile=true"))
    # fused kernels round differently from eager ones: float32 steps agree to ~1e-6 relative
    for a, b in zip(losses(compiled), losses(eager), strict=True):
        assert abs(a - b) < 1e-4 * abs(b), (a, b)


def test_one_fsdp_process_over_nccl(corpus_file, tmp_path):
    """FSDP joins a process group of one (nccl on a GPU) without torchrun: the run is the plain run's."""
    plain, sharded = tmp_path / "plain", tmp_path / "fsdp"
    train(tiny_config(corpus_file, plain, *STEPS, "device=cuda"))
    train(tiny_config(corpus_file, sharded, *STEPS, "device=cuda", "parallel=fsdp"))
    assert not dist.is_initialized()  # the group was torn down
    assert latest_checkpoint(sharded / "checkpoints").sharded
    for a, b in zip(losses(sharded), losses(plain), strict=True):
        assert abs(a - b) < 1e-5 * abs(b), (a, b)


def test_ddp_wrapper_over_nccl():
    """The DDP wrapper of data_parallel over an nccl group of one (one GPU): gradients pass through its all-reduce
    (an average over one worker: unchanged) and the codebook statistics through Distributed.all_reduce_sum_."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = TransformerVQ(preset("tiny")).cuda().train()
        reference = TransformerVQ(preset("tiny")).cuda().train()
        reference.load_state_dict(model.state_dict())
        # built as for several workers (the wrapper reads only whether to wrap): here the group has one
        info = dataclasses.replace(Distributed(), world_size=2)
        wrapped = data_parallel(model, info, torch.device("cuda", 0), find_unused=False)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        ids = torch.randint(0, 256, (2, 17), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        for module in (wrapped, reference):
            module(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)
        stats = model.codebook_stats()
        before = [t.clone() for t in stats]
        info.all_reduce_sum_(stats)
        assert all(torch.equal(a, b) for a, b in zip(stats, before))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two DDP workers over nccl need two GPUs")
def test_two_ddp_workers_match_one_process(corpus_file, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train(tiny_config(corpus_file, one, *STEPS, "device=cuda"))
    assert "on 2 x cuda" in torchrun([*cli_args(corpus_file, two, *STEPS), "--device", "cuda"]).stdout
    for a, b in zip(losses(one), losses(two), strict=True):
        assert abs(a - b) < 1e-4 * abs(a), (a, b)
