"""`tvq` as one of torchrun's workers: what every worker would say alike is said once, by rank 0; what one worker
meets on its own machine is said at once; commands that run in one process refuse torchrun; a resume the workers
cannot share the batch of names the worker counts that can; and torchrun's death stops the workers."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest

import transformer_vq.cli as cli
from cliutil import error_line


@pytest.fixture
def worker(monkeypatch, capsys):
    """This process as a torchrun worker (``.become(rank, world)``); its waits are recorded with what it had said
    before each, not slept, and the watch on its launcher is recorded, not started."""
    waits, armed = [], []
    monkeypatch.setattr(cli.time, "sleep", lambda seconds: waits.append((seconds, capsys.readouterr().err)))
    monkeypatch.setattr("transformer_vq.train.signals.stop_with_parent", lambda: armed.append(True))

    def become(rank: int, world: int) -> None:
        for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("TORCHELASTIC_RUN_ID", "none")):
            monkeypatch.setenv(name, str(value))

    return SimpleNamespace(become=become, waits=waits, armed=armed)


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_eval_and_sample_refuse_torchrun_as_classify_does(capsys, trained, worker, command):
    """Each worker ran the whole job and printed its result again."""
    worker.become(rank=0, world=2)
    line = error_line(capsys, [command, "--ckpt", str(trained)])
    assert line == f"error: tvq {command} runs in one process; run it without torchrun"
    assert worker.armed == [True]  # every torchrun worker stops with its launcher


def _errors():
    from transformer_vq.data.errors import DataError
    from transformer_vq.train.checkpoint.rundir import RunDirError

    return {
        "value": (ValueError("batch_size=3 must be a multiple of 2"), True),
        "data": (DataError("the corpus is empty"), True),
        "run-dir": (RunDirError("run directory r is in use by another training (pid 1 on h)"), True),
        "disk": (OSError(errno.ENOSPC, "No space left on device", "r/x"), False),
        "memory": (MemoryError(), False),
    }


@pytest.mark.parametrize("kind", ["value", "data", "run-dir", "disk", "memory"])
def test_rank_0_says_what_every_worker_meets_and_a_machines_error_is_said_at_once(capsys, monkeypatch, worker,
                                                                                  kind):
    """A refusal of the config, the data or the run directory comes alike on every worker (only a ConfigError was
    left to rank 0: the others printed one line per worker); a disk or memory may fail one worker alone, which must
    say it, at once."""
    err, every_worker = _errors()[kind]

    def run(args):
        raise err

    monkeypatch.setattr("transformer_vq.cli.version.run", run)
    worker.become(rank=1, world=2)
    line = error_line(capsys, ["version"])
    assert worker.waits == ([(cli.QUIET_RANK_WAIT_S, "")] if every_worker else [])
    worker.become(rank=0, world=2)
    assert error_line(capsys, ["version"]) == line and len(worker.waits) == int(every_worker)


def test_a_resume_on_workers_that_cannot_share_its_batch_names_the_counts_that_can(capsys, finished_run, worker,
                                                                                  monkeypatch):
    """Refused before the corpus is read, and not with "set batch_size to a multiple of 3", which the resume then
    refuses (the run keeps its batch_size, 4)."""
    def never(*args):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr("transformer_vq.train.lm.trainer.load_corpus_for", never)
    worker.become(rank=0, world=3)
    line = error_line(capsys, ["train", "--resume", "auto", "--run-dir", str(finished_run), "--steps", "4"])
    assert line == ("error: batch_size=4, which the resumed run keeps, must be a multiple of the number of "
                    "data-parallel workers (3): resume it with a number of workers that divides 4 (torchrun "
                    "--nproc_per_node 2 or 4) or in one process (without torchrun)")


def test_train_from_python_refuses_such_a_resume_in_the_same_words(finished_run, monkeypatch):
    """``train()`` under torchrun (a script of the user's, not ``tvq train``) knew only the generic advice, "set
    batch_size to a multiple of 3", which the resume refuses."""
    from transformer_vq.config import load_config
    from transformer_vq.train import train

    def never(*args):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr("transformer_vq.train.lm.trainer.load_corpus_for", never)
    cfg = load_config(file=finished_run / "config.json", overrides=["train.steps=4"])
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"^batch_size=4, which the resumed run keeps, .* \(torchrun "
                                         r"--nproc_per_node 2 or 4\) or in one process \(without torchrun\)$"):
        train(cfg, resume=str(finished_run))


def test_classify_refuses_torchrun_in_the_same_words(monkeypatch):
    """The one check tvq eval and tvq sample share with it (the Python function, before anything is made)."""
    from transformer_vq.config import ConfigError, classify_config
    from transformer_vq.train import classify_train

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"^tvq classify trains in one process; run it without torchrun$"):
        classify_train(classify_config(n_classes=2, vocab_size=8, preset="tiny"))


def test_tvq_classify_train_refuses_torchrun_before_reading_its_dataset(capsys, worker, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the dataset was read")

    monkeypatch.setattr("transformer_vq.cli.classify.build_config", never)
    worker.become(rank=0, world=2)
    assert error_line(capsys, ["classify", "train", "--data", "digits"]) == \
        "error: tvq classify trains in one process; run it without torchrun"
