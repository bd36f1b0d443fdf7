"""``--data text``: a local file or directory as a byte-level corpus."""

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus


def test_single_file_is_mapped_in_place(tmp_path, cache_dir):
    path = tmp_path / "a.txt"
    path.write_bytes(b"0123456789" * 100)
    corpus = load_corpus("text", data_path=str(path))
    assert corpus.name == "text" and corpus.vocab_size == 256
    assert {k: len(v) for k, v in corpus.splits.items()} == {"train": 900, "validation": 50, "test": 50}
    assert str(corpus.splits["train"].filename) == str(path)  # no copy
    assert bytes(corpus.splits["train"][:3]) == b"012" and bytes(corpus.splits["test"][-3:]) == b"789"
    assert corpus.documents["train"].tolist() == [0]
    assert not cache_dir.exists() or not any(cache_dir.rglob("*.bin"))


def test_directory_is_concatenated_in_sorted_order_with_documents(tmp_path):
    root = tmp_path / "books"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_bytes(b"B" * 400)
    (root / "a.txt").write_bytes(b"A" * 500)
    (root / "sub" / "c.md").write_bytes(b"C" * 100)
    (root / ".hidden").write_bytes(b"H" * 1000)
    corpus = load_corpus("text", data_path=root)
    data = np.concatenate([corpus.splits[s] for s in ("train", "validation", "test")])
    assert bytes(data) == b"A" * 500 + b"B" * 400 + b"C" * 100
    assert corpus.documents["train"].tolist() == [0, 500] and corpus.documents["test"].tolist() == [0]
    assert corpus.metadata["files"] == 3
    only_txt = load_corpus("text", data_path=root, glob="*.txt")
    assert sum(len(v) for v in only_txt.splits.values()) == 900


def test_directory_copy_is_rebuilt_when_a_file_changes(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    (root / "a.txt").write_bytes(b"x" * 100)
    first = load_corpus("text", data_path=root)
    (root / "a.txt").write_bytes(b"y" * 200)
    second = load_corpus("text", data_path=root)
    assert int(first.splits["train"][0]) == ord("x") and int(second.splits["train"][0]) == ord("y")
    assert second.metadata["total_bytes"] == 200


@pytest.mark.parametrize("make, message", [
    (lambda p: None, r"does not exist; pass --data-path"),
    (lambda p: p.write_bytes(b""), r"too short to split: 0 tokens"),
    (lambda p: p.write_bytes(b"short"), r"too short to split: 5 tokens"),
    (lambda p: p.mkdir(), r"contains no non-hidden files"),
])
def test_bad_text_paths(tmp_path, make, message):
    path = tmp_path / "input"
    make(path)
    with pytest.raises(DataError, match=message):
        load_corpus("text", data_path=path)


def test_text_needs_a_path():
    with pytest.raises(DataError, match="--data text needs a file or directory: pass --data-path"):
        load_corpus("text")


COMPRESSED = {  # what a user may hand over as text by mistake: each compressor's own bytes
    "gzip": lambda data: __import__("gzip").compress(data),
    "bzip2": lambda data: __import__("bz2").compress(data),
    "xz": lambda data: __import__("lzma").compress(data),
}


@pytest.mark.parametrize("fmt", sorted(COMPRESSED))
def test_a_compressed_file_is_refused_not_trained_on_as_bytes(tmp_path, fmt):
    packed = tmp_path / "book.txt"  # the name says text: the bytes decide
    packed.write_bytes(COMPRESSED[fmt](b"It was a dark and stormy night. " * 400))
    with pytest.raises(DataError, match=rf"book.txt is {fmt}-compressed data, not text.*unpack it first"):
        load_corpus("text", data_path=packed)
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"plain text " * 100)
    packed.rename(folder / "b.txt")
    with pytest.raises(DataError, match=rf"b.txt is {fmt}-compressed.*move it out of .*books.*glob="):
        load_corpus("text", data_path=folder, cache_dir=tmp_path / "cache")
    assert load_corpus("text", data_path=folder, glob="a.txt", cache_dir=tmp_path / "cache").split_bytes
