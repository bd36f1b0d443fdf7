"""Fixtures of the command-line tests: a small corpus, one tiny trained run per session (copied where a case
changes it), and a scratch working directory so that default paths (runs/, bench-results/) stay out of the tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from cliutil import tiny_train
from transformer_vq.cli import main

LINE = "the king shall speak to thee of love and war, my lord; good night.\n"


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _scratch(tmp_path, tmp_path_factory, monkeypatch):
    """Run every case in its own empty directory, with the data cache out of the user's home."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "plays.txt"
    path.write_text(LINE * 500)  # ~35 kB: enough for every split of the tiny runs
    return path


@pytest.fixture(scope="session")
def trained(corpus, tmp_path_factory) -> Path:
    """A finished 2-step run, read-only: copy it (``finished_run``) to change it."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(tiny_train(corpus, run_dir)) == 0
    return run_dir


@pytest.fixture
def finished_run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy
