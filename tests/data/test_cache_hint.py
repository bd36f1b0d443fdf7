"""The hint of an unusable cache directory names only what the failing command accepts: `tvq train` has no
--cache-dir flag, so its hint is $TVQ_CACHE_DIR; a cache_dir given by the caller is the caller's to change."""

from __future__ import annotations

import pytest

from transformer_vq.cli import main
from transformer_vq.data import cache
from transformer_vq.data.errors import DataError


def test_train_names_only_the_environment_variable(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    monkeypatch.setenv("TVQ_CACHE_DIR", str(blocker))
    texts = tmp_path / "texts"  # a directory of text files is concatenated into the cache
    texts.mkdir()
    (texts / "a.txt").write_text("some text\n" * 50)
    code = main(["train", "--data", "text", "--data-path", str(texts), "--steps", "1",
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and "cannot create the cache directory" in err, err
    assert f"Set TVQ_CACHE_DIR to a writable directory (it is {blocker})" in err and "--cache-dir" not in err


def test_the_default_root_is_named_when_the_variable_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("TVQ_CACHE_DIR")
    monkeypatch.setattr(cache.Path, "home", lambda: tmp_path / "file")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DataError, match=r"Set TVQ_CACHE_DIR to a writable directory \(unset: the default is ") as err:
        cache.dataset_dir("x")
    assert "--cache-dir" not in str(err.value)
