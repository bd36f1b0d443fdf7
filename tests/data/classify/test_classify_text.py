"""Text and retrieval: IMDB (aclImdb tarball or folder) and AAN pairs (LRA TSV), byte-level."""

import io
import tarfile

import numpy as np
import pytest

from transformer_vq.data import DataError
from transformer_vq.data.classify import load_classification

REVIEWS = {"train/pos/0_9.txt": "Great film. \u00e9", "train/pos/1_8.txt": "Loved it", "train/neg/0_2.txt": "Dull",
           "train/neg/1_1.txt": "Awful, awful", "train/unsup/0_0.txt": "unlabelled", "test/pos/0_10.txt": "Superb",
           "test/neg/0_3.txt": "Meh" * 10}


def write_imdb_dir(root):
    for name, text in REVIEWS.items():
        path = root / "aclImdb" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "aclImdb"


def write_imdb_tar(path):
    with tarfile.open(path, "w:gz") as archive:
        for name, text in REVIEWS.items():
            data = text.encode()
            info = tarfile.TarInfo(f"aclImdb/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def texts(examples):
    return sorted((bytes(np.asarray(examples[i][0], dtype=np.uint8)).decode(), examples[i][1])
                  for i in range(len(examples)))


@pytest.mark.parametrize("kind", ["directory", "tarball"])
def test_imdb_release(tmp_path, kind):
    source = write_imdb_dir(tmp_path) if kind == "directory" else write_imdb_tar(tmp_path / "aclImdb_v1.tar.gz")
    data = load_classification("imdb", data_path=source, validation_size=1, max_len=12)
    assert (data.vocab_size, data.n_classes, data.max_len) == (256, 2, 12)
    train = texts(data.splits["train"]) + texts(data.splits["validation"])
    assert sorted(train) == [("Awful, awful", 0), ("Dull", 0), ("Great film. ", 1), ("Loved it", 1)]  # 12 bytes
    assert texts(data.splits["test"]) == [("MehMehMehMeh", 0), ("Superb", 1)]
    again = load_classification("imdb", data_path=source, validation_size=1, max_len=12, seed=0,
                                cache_dir=tmp_path / "other")
    assert texts(again.splits["validation"]) == texts(data.splits["validation"])


def test_imdb_errors(tmp_path):
    (tmp_path / "empty" / "aclImdb" / "train" / "pos").mkdir(parents=True)
    with pytest.raises(DataError, match=r"has no train/neg and train/pos reviews"):
        load_classification("imdb", data_path=tmp_path / "empty")
    (tmp_path / "broken.tar.gz").write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(DataError, match=r"cannot read .*broken.tar.gz as a tar archive"):
        load_classification("imdb", data_path=tmp_path / "broken.tar.gz")
    with pytest.raises(DataError, match=r"imdb is not fetched automatically; download aclImdb_v1.tar.gz"):
        load_classification("imdb")


def write_aan(root, rows=None):
    rows = rows or ["1.0\tP01\tP02\tAttention is all\tWe cite attention", "0\tP03\tP04\tAbc\t\u00fcber"]
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval", "test"):
        (root / f"new_aan_pairs.{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def test_aan_pairs_are_one_sequence_with_a_separator(tmp_path, cache_dir):
    data = load_classification("aan", data_path=write_aan(tmp_path / "tsv_data"), max_doc_len=8)
    stored = list((cache_dir / "aan").iterdir())
    assert len(stored) == 1 and not stored[0].name.startswith(".")  # the streaming scratch files are gone
    assert (data.vocab_size, data.n_classes, data.max_len, data.metadata["separator_id"]) == (257, 2, 17, 256)
    tokens, label = data.splits["train"][0]
    assert np.asarray(tokens).tolist() == list(b"Attentio") + [256] + list(b"We cite ") and label == 1
    tokens, label = data.splits["test"][1]
    assert np.asarray(tokens).tolist() == list(b"Abc") + [256] + list("\u00fcber".encode()) and label == 0


@pytest.mark.parametrize("row, message", [
    ("1\tP1\tP2\tonly one text", r"new_aan_pairs.train.tsv:2: expected 5 tab-separated fields \(label, id1, id2, "
                                 r"text1, text2\), got 4"),
    ("yes\tP1\tP2\ta\tb", r"new_aan_pairs.train.tsv:2: the label 'yes' is not 0 or 1"),
])
def test_aan_malformed_rows(tmp_path, row, message):
    write_aan(tmp_path)
    (tmp_path / "new_aan_pairs.train.tsv").write_text("0\tA\tB\tx\ty\n" + row + "\n")
    with pytest.raises(DataError, match=message):
        load_classification("aan", data_path=tmp_path)
