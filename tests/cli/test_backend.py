"""``--attn-backend triton`` where triton cannot run (a CPU without TRITON_INTERPRET=1): a command that was asked
for it refuses before it creates anything; a command that reads a run trained with it (on a GPU) reads it with the
eager backend, the same attention."""

from __future__ import annotations

import json

import pytest
import torch

from cliutil import error_line, run_cli, tiny_train
from transformer_vq import fileio
from transformer_vq.cli import main
from transformer_vq.train.checkpoint.store import FILES

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine where triton cannot run")

REFUSAL = ("error: --attn-backend: backend='triton' runs on CUDA tensors, got cpu; on a CPU set TRITON_INTERPRET=1 "
           "before the first import of triton to run its interpreter; or backend='eager' (attn_backend 'eager' in a "
           "model config) is the same attention")


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_training_refuses_before_the_run_dir_exists(capsys, corpus, tmp_path):
    assert error_line(capsys, [*tiny_train(corpus, tmp_path / "run"), "--attn-backend", "triton"]) == REFUSAL
    assert not (tmp_path / "run").exists()


def test_a_benchmark_refuses_before_writing(capsys, tmp_path):
    argv = ["bench", "train", "--preset", "tiny", "--models", "vq/shga", "--attn-backend", "triton", "--no-isolate",
            "--out", str(tmp_path / "out")]
    assert error_line(capsys, argv) == REFUSAL
    assert not (tmp_path / "out").exists()


def _as_trained_with_triton(run_dir):
    """Rewrite every config of a copied run as a GPU run with the fused kernels would have written it."""
    for path in [run_dir / "config.json", *run_dir.glob("checkpoints/step_*/config.json")]:
        config = json.loads(path.read_text())
        config["model"]["attn_backend"] = "triton"
        path.write_text(json.dumps(config))
    for checkpoint in run_dir.glob("checkpoints/step_*"):
        fileio.write_dir_manifest(checkpoint, FILES)


def test_a_triton_run_is_read_with_eager(capsys, finished_run):
    def eval_loss():
        assert main(["eval", "--ckpt", str(finished_run), "--max-tokens", "300", "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"]

    before = eval_loss()
    _as_trained_with_triton(finished_run)
    assert eval_loss() == before
    code, err = run_cli(capsys, ["sample", "--ckpt", str(finished_run), "--max-new-tokens", "5", "--seed", "0"])
    assert code == 0, err


@pytest.mark.parametrize("interpreter", [False, True])
def test_an_export_of_a_triton_run_says_eager_on_any_machine(capsys, finished_run, tmp_path, monkeypatch, interpreter):
    """What ``tvq export`` writes does not depend on where it runs: the backend is read as 'eager' (the same
    attention; the directory then runs everywhere), also where triton could run (here: its CPU interpreter)."""
    if interpreter:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    _as_trained_with_triton(finished_run)
    out = tmp_path / "export"
    assert main(["export", "--format", "safetensors", "--ckpt", str(finished_run), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["attn_backend"] == "eager"

