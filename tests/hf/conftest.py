"""Fixtures of the Hugging Face tests: one thread, and one tiny run trained by `tvq train` for the export tests (the
tiny library model is in hfutil.py). Nothing here imports transformers: each test module skips itself without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_vq.cli import main

LINE = "the king shall speak to thee of love and war, my lord; good night.\n"


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise comparisons between two code paths want one reduction order
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A run directory written by `tvq train` (tiny preset, two steps)."""
    root = tmp_path_factory.mktemp("run")
    corpus = root / "plays.txt"
    corpus.write_text(LINE * 500)
    run_dir = root / "run"
    code = main(["train", "--preset", "tiny", "--data", "text", "--data-path", str(corpus), "--run-dir",
                 str(run_dir), "--seq-len", "32", "--update-len", "16", "--batch-size", "4", "--steps", "2",
                 "--sample-tokens", "0", "--eval-tokens", "0", "--log-every", "1000"])
    assert code == 0
    return run_dir


@pytest.fixture(scope="session")
def exported(trained_run, tmp_path_factory) -> Path:
    """The `tvq export --format hf` directory of `trained_run` (read-only for the tests)."""
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", "--format", "hf", "--ckpt", str(trained_run), "--out", str(out)]) == 0
    return out
