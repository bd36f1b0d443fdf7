"""The one type every dataset loader returns.

A corpus is a set of named splits, each a flat 1-D array of token ids (a ``np.memmap`` where the
data is on disk, so nothing is copied into Python lists), plus what is needed to turn ids back into
text and to report bits per byte over the *original* bytes of the split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from transformer_vq.data.codec import decode_bytes, encode_bytes
from transformer_vq.data.errors import DataError


@dataclass
class Corpus:
    """A tokenized dataset.

    Attributes:
        name: the dataset's name (``"shakespeare"``, ``"enwik8"``, ...).
        splits: split name (``"train"``, ``"validation"``, ``"test"``) -> 1-D integer token array.
        vocab_size: number of distinct token ids the model must cover (256 for byte-level data).
        split_bytes: split name -> number of bytes of original text the split encodes; bits per
            byte is total NLL in bits divided by this. For byte-level data it equals the length.
        encode: text -> token ids (byte-level by default).
        decode: token ids -> text (byte-level by default, invalid UTF-8 replaced).
        eod_id: token id separating documents, or ``None`` when the corpus has no boundaries.
        metadata: JSON-serializable facts worth saving with a run (source, checksum, tokenizer
            path, ...); keep it small, large arrays belong in ``splits`` / ``documents``.
        documents: split name -> sorted 1-D int64 array of the token offsets (within the split)
            where a document starts; empty when the corpus has no document structure. A split
            cut out of a longer stream starts at offset 0 even when that is mid-document.
    """

    name: str
    splits: Mapping[str, np.ndarray]
    vocab_size: int
    split_bytes: Mapping[str, int] = field(default_factory=dict)
    encode: Callable[[str], list[int]] = encode_bytes
    decode: Callable[[Sequence[int]], str] = decode_bytes
    eod_id: int | None = None
    metadata: dict = field(default_factory=dict)
    documents: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        for split, tokens in self.splits.items():
            if tokens.ndim != 1:
                raise ValueError(f"split {split!r} of corpus {self.name!r} must be 1-D, got shape {tokens.shape}")
        if not self.split_bytes:
            self.split_bytes = {split: int(len(tokens)) for split, tokens in self.splits.items()}

    def split(self, name: str) -> np.ndarray:
        """The token array of split ``name``, with a clear error when the split does not exist."""
        if name not in self.splits:
            raise DataError(f"corpus {self.name!r} has no split {name!r}; choose one of "
                            f"{', '.join(sorted(self.splits))}")
        return self.splits[name]


SAMPLED_PIECES, PIECE_TOKENS = 64, 4096
"""A corpus's fingerprint reads this many evenly spaced pieces of this many tokens of each split (at most 256k
tokens a split: milliseconds, whatever the corpus's size)."""


def corpus_fingerprint(corpus: Corpus) -> dict:
    """What identifies a corpus's tokens, small enough to save in every checkpoint: its name, each split's length and
    a SHA-256 of evenly spaced pieces of each split. A resumed run compares it with its checkpoint's, so that it
    continues on the corpus it was trained on: a corpus moved to another path is the same, another file (or the same
    one re-tokenized) is not. Sampled, so an edit between the pieces of a file of the same length can pass. Beside
    it, a SHA-256 of every split's document starts (``None`` where the corpus records none): the same bytes cut into
    other documents pack into other sequences (``--pack``)."""
    import hashlib

    digest, lengths = hashlib.sha256(), {}
    for name in sorted(corpus.splits):
        tokens = corpus.splits[name]
        lengths[name] = int(len(tokens))
        starts = np.linspace(0, max(len(tokens) - PIECE_TOKENS, 0), num=SAMPLED_PIECES, dtype=np.int64)
        for start in np.unique(starts):
            digest.update(np.ascontiguousarray(tokens[start:start + PIECE_TOKENS], dtype=np.int64).tobytes())
    documents = None
    if corpus.documents:
        documents = hashlib.sha256()
        for name in sorted(corpus.documents):
            documents.update(name.encode() + np.ascontiguousarray(corpus.documents[name], dtype=np.int64).tobytes())
    return {"name": corpus.name, "tokens": lengths, "sample_sha256": digest.hexdigest(),
            "documents_sha256": None if documents is None else documents.hexdigest()}
