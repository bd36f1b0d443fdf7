"""Fixtures of the training tests (helpers are in trainutil.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainutil import tiny_config, write_corpus
from transformer_vq.train import train


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The test models are tiny: one thread avoids synchronization overhead on a shared CPU, and the
    in-process runs use the same thread count as the subprocesses (see trainutil.tvq_process), which
    bitwise comparisons need."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep the data layer's cache out of the user's home directory."""
    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "plays.txt")


@pytest.fixture(scope="session")
def trained_run(corpus_file, tmp_path_factory) -> Path:
    """A run directory with a tiny model trained for 6 steps (used read-only by several tests)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    result = train(tiny_config(corpus_file, run_dir, "steps=6", "ckpt_every=3"))
    assert result.exit_code == 0
    return run_dir
