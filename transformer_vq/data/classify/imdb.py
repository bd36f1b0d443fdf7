"""``imdb``: IMDB movie-review sentiment (Maas et al., 2011) as byte sequences (LRA Text).

LRA Text reads the IMDB reviews byte by byte (vocabulary 256) and truncates each to 4,096 bytes
(``max_len``). The source is the release ``aclImdb_v1.tar.gz`` (TensorFlow Datasets'
``imdb_reviews``, which LRA used, is built from it): ``aclImdb/{train,test}/{neg,pos}/<id>_<stars>.txt``,
one UTF-8 review per file, 12,500 per folder; ``train/unsup`` (unlabelled) is ignored. Label 0 is
``neg``, 1 is ``pos``. ``data_path`` is the tarball (read as a stream, never unpacked) or the
unpacked ``aclImdb`` directory. The release orders reviews by label, so the training reviews are
put in an order drawn from ``seed`` before the last ``validation_size`` (default 2,500) are held
out to validate; the 25,000 test reviews are the test split. Converted once into the cache.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Iterator

import numpy as np

from transformer_vq.data.classify.examples import ClassificationData, Examples, holdout
from transformer_vq.data.classify.store import cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import NonNegative, Positive
from transformer_vq.data.progress import Advance, no_progress

LABELS = {"neg": 0, "pos": 1}
MEMBER = re.compile(r"(?:^|/)(train|test)/(neg|pos)/(\d+)_(\d+)\.txt$")
GET_IT = ("download aclImdb_v1.tar.gz from https://ai.stanford.edu/~amaas/data/sentiment/ and pass it (or the "
          "unpacked aclImdb directory) with --data-path")


def reviews(source: Path) -> Iterator[tuple[str, int, int, bytes]]:
    """``(split, label, review id, text bytes)`` of every labelled review in the tarball or directory."""
    if source.is_dir():
        for path in sorted(source.rglob("*.txt")):
            match = MEMBER.search(path.relative_to(source).as_posix())
            if match:
                yield match.group(1), LABELS[match.group(2)], int(match.group(3)), path.read_bytes()
        return
    try:
        with tarfile.open(source, mode="r|*") as archive:  # a stream: members are read in order, once
            for member in archive:
                match = MEMBER.search(member.name)
                if match and member.isfile():
                    yield match.group(1), LABELS[match.group(2)], int(match.group(3)), \
                        archive.extractfile(member).read()
    # tarfile's stream reader raises TypeError on some corrupt gzip headers
    except (tarfile.TarError, OSError, EOFError, TypeError) as exc:
        raise DataError(f"cannot read {source} as a tar archive ({exc}); {GET_IT}") from exc


def convert(source: Path, max_len: int, seed: int, advance: Advance = no_progress) -> dict[str, Examples]:
    """Train (in an order drawn from ``seed``) and test examples, each review truncated to ``max_len`` bytes
    (``advance`` counts the reviews read)."""
    found: dict[str, list[tuple[int, int, np.ndarray]]] = {"train": [], "test": []}
    for split, label, review_id, text in reviews(source):
        found[split].append((label, review_id, np.frombuffer(text[:max_len], dtype=np.uint8)))
        advance(1)
    splits = {}
    for split, items in found.items():
        if not items or len({label for label, _, _ in items}) < 2:
            raise DataError(f"{source} has no {split}/neg and {split}/pos reviews (aclImdb/{split}/<neg|pos>/"
                            f"<id>_<stars>.txt); {GET_IT}")
        items.sort(key=lambda item: (item[0], item[1]))  # release order, independent of the file system
        order = np.random.default_rng(seed).permutation(len(items)) if split == "train" else range(len(items))
        splits[split] = Examples.ragged([items[i][2] for i in order], [items[i][0] for i in order], np.uint8)
    return splits


def load_imdb(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
              max_len: Positive = 4096, validation_size: Positive = 2_500,
              seed: NonNegative = 0) -> ClassificationData:
    """IMDB reviews as byte sequences of at most ``max_len`` (2 classes: negative, positive)."""
    if data_path is None:
        raise DataError(f"imdb is not fetched automatically; {GET_IT}")
    source = Path(data_path).expanduser()
    if not source.exists():
        raise DataError(f"{source} does not exist; {GET_IT}")
    options = {"max_len": max_len, "seed": seed, "format": 1}
    stored = cached_splits("imdb", [source], options, lambda _, advance: convert(source, max_len, seed, advance),
                           cache_dir, splits=("train", "test"), unit="review")
    train, validation = holdout(stored["train"], validation_size, "imdb")
    return ClassificationData("imdb", {"train": train, "validation": validation, "test": stored["test"]},
                              vocab_size=256, n_classes=2, max_len=max_len, class_names=("negative", "positive"),
                              metadata={"source": str(source), "tokenization": "bytes", "max_len": max_len,
                                        "validation_size": validation_size, "seed": seed})
