"""The lines `tvq train` ends with: after a signal, the command that continues the same run (once, from the main
torchrun worker, with torchrun and its worker count); after training, a sample prompt that fits the corpus."""

from __future__ import annotations

import dataclasses

import pytest

from cliutil import tiny_train
from transformer_vq.cli import main
from transformer_vq.cli.train import run_training
from transformer_vq.config import load_config


@dataclasses.dataclass
class Stopped:
    """What a training job returns after SIGTERM (exit status 143) at step 94."""

    step: int = 94
    run_dir: str = "runs/r"
    exit_code: int = 143


def _torchrun_worker(monkeypatch, rank: int, world: int, per_node: int | None = None):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node or world))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's own: RANK alone is set by other launchers too


def test_one_process_continues_with_the_plain_command(capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert run_training(Stopped, "tvq train")[1] == 143
    assert capsys.readouterr().err == "stopped at step 94; continue with: tvq train --resume auto --run-dir runs/r\n"


@pytest.mark.parametrize("command", ["tvq train", "tvq classify train"])
def test_torchrun_workers_print_one_line_that_keeps_their_count(capsys, monkeypatch, command):
    _torchrun_worker(monkeypatch, rank=1, world=2)
    assert run_training(Stopped, command)[1] == 143
    assert capsys.readouterr().err == ""  # only the main worker speaks: one line, not one per worker
    _torchrun_worker(monkeypatch, rank=0, world=2)
    assert run_training(Stopped, command)[1] == 143
    sub = command.removeprefix("tvq ")
    assert capsys.readouterr().err == (f"stopped at step 94; continue with: torchrun --standalone --nproc_per_node 2 "
                                       f"-m transformer_vq {sub} --resume auto --run-dir runs/r\n")


def test_several_nodes_are_named_too(capsys, monkeypatch):
    _torchrun_worker(monkeypatch, rank=0, world=16, per_node=8)
    run_training(Stopped, "tvq train")
    assert "continue with: torchrun --nnodes 2 --nproc_per_node 8 -m transformer_vq train " in capsys.readouterr().err


@pytest.mark.parametrize("data, hint", [("shakespeare", " --prompt 'ROMEO:'"), ("text", ""), ("enwik8", "")])
def test_the_sample_prompt_fits_the_corpus(data, hint):
    from transformer_vq.cli.train import sample_hint

    assert sample_hint(load_config("tiny", overrides=[f"data={data}"])) == hint


def test_a_run_on_the_user_s_text_suggests_no_shakespeare_prompt(corpus, tmp_path, capsys):
    assert main(tiny_train(corpus, tmp_path / "run")) == 0
    next_line = capsys.readouterr().out.splitlines()[-1]
    assert next_line.startswith("next: tvq eval --ckpt ") and "ROMEO" not in next_line, next_line
    assert next_line.endswith(f"tvq sample --ckpt {tmp_path / 'run'}"), next_line


def test_a_training_error_is_said_by_rank_0_and_by_another_worker_only_after_a_wait(capsys, monkeypatch):
    """The guard that stops a training decides on every worker alike: one line, not one per worker."""
    import transformer_vq.cli as cli
    from transformer_vq.train import TrainingError

    def job():
        raise TrainingError("5 non-finite steps in a row; lower --lr")

    waits = []
    monkeypatch.setattr(cli.time, "sleep", lambda seconds: waits.append((seconds, capsys.readouterr().err)))
    for rank in (1, 0):
        _torchrun_worker(monkeypatch, rank=rank, world=2)
        assert run_training(job, "tvq train") == (None, 1)
        assert capsys.readouterr().err == "error: 5 non-finite steps in a row; lower --lr\n"
    assert waits == [(cli.QUIET_RANK_WAIT_S, "")]  # rank 1's; torchrun stops it there once rank 0 has exited
