"""Shared fixtures of the data tests: every test gets its own cache, never the user's."""

import pytest


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """A fresh ``$TVQ_CACHE_DIR`` under the test's tmp_path (the real user cache is never touched)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("TVQ_CACHE_DIR", str(path))
    return path
