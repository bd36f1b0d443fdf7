"""Fixtures of the GPU tests (every test here is marked ``gpu`` and skipped without CUDA: see tests/conftest.py).

The training helpers of tests/train (the tiny corpus and run config, ``torchrun``) serve these tests too: their
directory is put on the import path rather than copied.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from trainutil import write_corpus  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep the data layer's cache out of the user's home directory."""
    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "plays.txt")
