"""The cache (atomic writes, manifests) and the fixed contiguous splits."""

import os

import numpy as np
import pytest

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.classify import load_classification
from transformer_vq.data.errors import DataError
from transformer_vq.data.splits import byte_corpus, documents_per_split, split_bounds


def test_cache_root_from_env_and_override(cache_dir, tmp_path):
    assert cache.cache_root() == cache_dir
    assert cache.cache_root(tmp_path / "other") == tmp_path / "other"
    assert cache.dataset_dir("x") == cache_dir / "x" and (cache_dir / "x").is_dir()


def test_cache_root_default_is_home_cache(monkeypatch):
    monkeypatch.delenv("TVQ_CACHE_DIR")
    assert cache.cache_root() == cache.Path.home() / ".cache" / "transformer-vq"


def test_unwritable_cache_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(DataError, match="cannot create the cache directory .*given .cache_dir. must be writable"):
        cache.dataset_dir("x", blocker)


def test_atomic_writer_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with fileio.atomic_writer(target) as handle:
            handle.write(b"partial")
            raise RuntimeError("crash")
    assert not target.exists() and os.listdir(tmp_path) == []
    fileio.atomic_write_bytes(target, b"done")
    assert target.read_bytes() == b"done" and os.listdir(tmp_path) == ["out.bin"]


def test_manifest_detects_changed_file(tmp_path):
    target = tmp_path / "data.bin"
    fileio.atomic_write_bytes(target, b"abc")
    manifest = fileio.write_manifest(target, note="x")
    assert manifest["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert fileio.verified_manifest(target)["note"] == "x"
    target.write_bytes(b"abd")  # same size, different content
    assert fileio.verified_manifest(target) is None
    assert fileio.verified_manifest(target, full=False) is not None  # size-only check
    target.write_bytes(b"abcd")
    assert fileio.verified_manifest(target, full=False) is None


def test_enwik8_sized_split_is_exactly_90_5_5():
    assert split_bounds(100_000_000) == {
        "train": (0, 90_000_000), "validation": (90_000_000, 95_000_000), "test": (95_000_000, 100_000_000)}


def test_split_errors_name_the_fix():
    with pytest.raises(DataError, match=r"too short to split: 30 tokens give a split of only 1 .*at least about 41"):
        split_bounds(30, name="tiny")
    with pytest.raises(DataError, match="summing to 1"):
        split_bounds(1000, (0.5, 0.5, 0.5))


def test_documents_per_split():
    bounds = split_bounds(100)
    docs = documents_per_split([0, 10, 90, 95, 97], bounds)
    assert docs["train"].tolist() == [0, 10]
    assert docs["validation"].tolist() == [0]  # doc starting exactly at 90 is the split start
    assert docs["test"].tolist() == [0, 2]


def test_byte_corpus_is_a_memmap_of_the_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 4)
    corpus = byte_corpus("t", path)
    assert corpus.vocab_size == 256 and corpus.eod_id is None
    assert {k: len(v) for k, v in corpus.splits.items()} == {"train": 922, "validation": 51, "test": 51}
    assert isinstance(corpus.splits["train"], np.memmap)
    assert corpus.split_bytes == {"train": 922, "validation": 51, "test": 51}
    assert int(corpus.splits["validation"][0]) == 922 % 256 and int(corpus.splits["test"][-1]) == 255
    assert corpus.decode(corpus.encode("héllo")) == "héllo"


def test_byte_corpus_missing_file(tmp_path):
    with pytest.raises(DataError, match="cannot read .*missing.*check the path"):
        byte_corpus("t", tmp_path / "missing")


def touch_later(path, text):
    """Rewrite ``path`` with ``text`` and move its modification time on (file systems with coarse clocks)."""
    stat = path.stat()
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_fingerprint_follows_every_file_below_a_directory_and_every_option(tmp_path):
    deep = tmp_path / "data" / "a" / "b" / "c.txt"
    deep.parent.mkdir(parents=True)
    deep.write_text("one")
    first = cache.fingerprint([tmp_path / "data"], size=1)
    assert cache.fingerprint([tmp_path / "data"], size=1) == first and len(first) == 20
    assert cache.fingerprint([tmp_path / "data"], size=2) != first
    touch_later(deep, "two")  # same size, later time
    second = cache.fingerprint([tmp_path / "data"], size=1)
    assert second != first
    (deep.parent / "new.txt").write_text("x")
    third = cache.fingerprint([tmp_path / "data"], size=1)
    assert third not in (first, second)
    (deep.parent / "new.txt").unlink()
    assert cache.fingerprint([tmp_path / "data"], size=1) == second
    assert cache.input_listing([deep]) == [[str(deep.resolve()), 3, deep.stat().st_mtime_ns]]


def test_a_file_changed_deep_inside_a_dataset_directory_rebuilds_its_cached_splits(tmp_path, cache_dir):
    review = tmp_path / "aclImdb" / "test" / "pos" / "0_10.txt"
    review.parent.mkdir(parents=True)
    for name, text in {"train/pos/0_9.txt": "Great", "train/neg/0_2.txt": "Dull", "test/neg/0_3.txt": "Meh"}.items():
        (tmp_path / "aclImdb" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "aclImdb" / name).write_text(text)
    review.write_text("Superb")
    before = load_classification("imdb", data_path=tmp_path, validation_size=1).splits["test"]
    touch_later(review, "Superbly")
    after = load_classification("imdb", data_path=tmp_path, validation_size=1).splits["test"]
    assert [bytes(np.asarray(e[0], np.uint8)) for e in (before[1], after[1])] == [b"Superb", b"Superbly"]
    assert len(list((cache_dir / "imdb").glob("*/key.json"))) == 2  # the stale entry is never read again
