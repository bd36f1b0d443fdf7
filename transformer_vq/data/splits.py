"""Fixed train/validation/test splits of one token stream, and the byte-level corpus built on them.

Byte-level corpora (``text``, ``shakespeare``, ``gcide``, ``enwik8``) are one file of bytes cut
into three contiguous pieces: the first 90% trains, the next 5% validates, the last 5% tests
(enwik8's conventional 90M/5M/5M). Contiguous cuts keep long-range structure inside each split
and make the split reproducible from the file alone. The splits are slices of one read-only
``np.memmap`` of the file, so nothing is read until a batch needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from transformer_vq.config.choices import SPLITS
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError

DEFAULT_FRACTIONS = (0.90, 0.05, 0.05)

# A split must hold at least one (input, target) pair to be trained or evaluated on.
MIN_SPLIT_TOKENS = 2


def split_bounds(
    length: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    name: str = "corpus",
    min_split_tokens: int = MIN_SPLIT_TOKENS,
) -> dict[str, tuple[int, int]]:
    """``[start, end)`` token ranges of the train/validation/test splits of a stream of ``length``.

    The cut points are ``round(length * cumulative_fraction)``, so a 100,000,000-byte stream
    splits exactly 90,000,000 / 5,000,000 / 5,000,000. Raises :class:`DataError` when the
    fractions are invalid or the stream is too short to give every split ``min_split_tokens``.
    """
    rule = (f"split fractions must be three positive numbers (train, validation, test) summing to 1, "
            f"got {{}}; the default is {DEFAULT_FRACTIONS}")
    try:  # from a --data-option, anything may arrive: a word, one number, null
        fractions = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        raise DataError(rule.format(repr(fractions))) from None
    if len(fractions) != len(SPLITS) or any(not f > 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise DataError(rule.format(fractions))
    cut1 = round(length * fractions[0])
    cut2 = round(length * (fractions[0] + fractions[1]))
    bounds = {"train": (0, cut1), "validation": (cut1, cut2), "test": (cut2, length)}
    shortest = min(end - start for start, end in bounds.values())
    if shortest < min_split_tokens:
        # Smallest length whose smallest split reaches the minimum (fractions are fixed).
        needed = int(np.ceil(min_split_tokens / min(fractions))) + 1
        raise DataError(
            f"{name} is too short to split: {length:,} tokens give a split of only {shortest} "
            f"(each of train/validation/test needs at least {min_split_tokens}). "
            f"Use a corpus of at least about {needed:,} tokens (bytes, for byte-level data)"
        )
    return bounds


def documents_per_split(doc_starts: Sequence[int] | np.ndarray,
                        bounds: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    """Split-relative document start offsets, given document starts in the whole stream.

    Each split's array begins with 0 (the split's first token starts a document, or continues
    one that began in the previous split) followed by the starts that fall inside the split.
    """
    starts = np.asarray(doc_starts, dtype=np.int64)
    out = {}
    for split, (begin, end) in bounds.items():
        inside = starts[(starts > begin) & (starts < end)] - begin
        out[split] = np.concatenate([np.zeros(1, dtype=np.int64), inside])
    return out


def byte_corpus(
    name: str,
    path: str | os.PathLike,
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    doc_starts: Sequence[int] | None = None,
    metadata: dict | None = None,
) -> Corpus:
    """A byte-level :class:`Corpus` over the bytes of file ``path``, split contiguously.

    Token ids are the raw bytes (vocabulary 256, no end-of-document token); ``split_bytes`` equals
    the split lengths. ``doc_starts`` (byte offsets of documents in the file) fills
    ``Corpus.documents``. Splits are ``uint8`` memmaps: convert slices with ``.astype(np.int64)``.
    """
    path = Path(path)
    try:
        length = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc}); check the path") from exc
    bounds = split_bounds(length, fractions, name=f"{name} ({path})")
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc}); check its permissions") from exc
    splits = {split: data[start:end] for split, (start, end) in bounds.items()}
    documents = documents_per_split(doc_starts, bounds) if doc_starts is not None else {}
    meta = {
        "path": str(path),
        "total_bytes": int(length),
        "split_ranges": {split: [int(a), int(b)] for split, (a, b) in bounds.items()},
        "tokenization": "bytes",
        **(metadata or {}),
    }
    return Corpus(name=name, splits=splits, vocab_size=256, metadata=meta, documents=documents)
