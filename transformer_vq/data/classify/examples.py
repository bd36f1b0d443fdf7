"""The one type every classification loader returns: labelled token sequences per split.

A split is an :class:`Examples`: every sequence of the split laid end to end in one flat token array
(a ``np.memmap`` where the data is on disk), the ``offsets`` where each sequence starts, and one
label per sequence. Example ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` with label ``labels[i]``;
fixed-length data (images) simply has evenly spaced offsets. Nothing is copied into Python lists,
so a 96,000-sequence ListOps split or 60,000 Fashion-MNIST images cost one memory map each.

The model sees a batch as ``[B, T]`` token ids plus a ``[B, T]`` mask of real tokens (see
:mod:`transformer_vq.data.classify.batching`): sequences of a batch are padded to a common length
with ``pad_id``. ``pad_id`` may coincide with a real token (pixel value 0): the mask, never the id,
tells padding apart. docs/datasets.md lists every dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from transformer_vq.config.choices import SPLITS
from transformer_vq.data.errors import DataError


@dataclass(frozen=True)
class Examples:
    """Labelled token sequences stored flat.

    Attributes:
        tokens: 1-D integer array, every sequence end to end.
        offsets: 1-D ``int64`` array of ``len(self) + 1`` non-decreasing positions in ``tokens``.
        labels: 1-D ``int64`` array, one class index per sequence.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    def __post_init__(self):
        if self.tokens.ndim != 1 or self.offsets.ndim != 1 or self.labels.ndim != 1:
            raise ValueError("tokens, offsets and labels must be 1-D arrays")
        if len(self.offsets) != len(self.labels) + 1:
            raise ValueError(f"need len(labels) + 1 = {len(self.labels) + 1} offsets, got {len(self.offsets)}")
        if len(self.offsets) and (self.offsets[0] < 0 or self.offsets[-1] > len(self.tokens)
                                  or np.any(np.diff(self.offsets) < 0)):
            raise ValueError(f"offsets must rise from >= 0 to at most len(tokens) = {len(self.tokens)}")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """``(token ids, label)`` of example ``index``."""
        return self.tokens[self.offsets[index]:self.offsets[index + 1]], int(self.labels[index])

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example (``int64``)."""
        return np.diff(self.offsets)

    @classmethod
    def fixed(cls, rows: np.ndarray, labels) -> "Examples":
        """Examples from a ``[N, L]`` array of equal-length sequences (kept as a view, not copied)."""
        n, length = rows.shape
        return cls(rows.reshape(-1), np.arange(n + 1, dtype=np.int64) * length, np.asarray(labels, dtype=np.int64))

    @classmethod
    def ragged(cls, sequences: Sequence, labels, dtype=np.uint16) -> "Examples":
        """Examples from a list of 1-D sequences of any lengths (copied into one ``dtype`` array)."""
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        tokens = np.concatenate([np.asarray(s, dtype=dtype) for s in sequences]) if len(sequences) else \
            np.zeros(0, dtype=dtype)
        return cls(tokens.astype(dtype, copy=False), offsets, np.asarray(labels, dtype=np.int64))

    def window(self, start: int, stop: int) -> "Examples":
        """Examples ``start .. stop - 1`` as views of the same storage (no copy)."""
        offsets = self.offsets[start:stop + 1]
        return Examples(self.tokens[offsets[0]:offsets[-1]], offsets - offsets[0], self.labels[start:stop])


def holdout(train: Examples, validation_size: int, name: str) -> tuple[Examples, Examples]:
    """``(train, validation)``: the last ``validation_size`` examples of ``train`` validate.

    Used where a release has only train and test: the released training set is shuffled, so its
    tail is as good a sample as any, and a contiguous tail keeps both parts memory-map views.
    """
    if not 0 < validation_size < len(train):
        raise DataError(f"{name}: validation_size must be between 1 and {len(train) - 1} (the training set has "
                        f"{len(train)} examples), got {validation_size}; pass a smaller validation_size")
    cut = len(train) - validation_size
    return train.window(0, cut), train.window(cut, len(train))


@dataclass
class ClassificationData:
    """A sequence-classification dataset.

    Attributes:
        name: its registry name (``"listops"``, ``"cifar10"``, ...).
        splits: ``"train"``, ``"validation"``, ``"test"`` -> :class:`Examples`.
        vocab_size: token ids lie in ``[0, vocab_size)``.
        n_classes: labels lie in ``[0, n_classes)``.
        max_len: no sequence is longer (a model sized for it sees every example whole).
        pad_id: the id batches put in padded positions (padding is told apart by the mask).
        class_names: a name per class where the dataset has them, else empty.
        metadata: JSON-serializable facts worth saving with a run (source, options, checksums).
        identity: what :func:`~transformer_vq.data.classify.load_classification` loaded it as (its ``data``,
            ``data_path`` and every one of its ``data_options``: ``dataset_identity``); None for data built by
            hand, which no run config names.
    """

    name: str
    splits: Mapping[str, Examples]
    vocab_size: int
    n_classes: int
    max_len: int
    pad_id: int = 0
    class_names: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)
    identity: dict | None = None

    def __post_init__(self):
        if set(self.splits) != set(SPLITS):
            raise ValueError(f"dataset {self.name!r} must have splits {SPLITS}, got {tuple(self.splits)}")
        if self.class_names and len(self.class_names) != self.n_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.n_classes} classes")
        for split, examples in self.splits.items():
            check_examples(examples, self, split)

    def split(self, name: str) -> Examples:
        """The examples of split ``name``, with a clear error when the split does not exist."""
        if name not in self.splits:
            raise DataError(f"dataset {self.name!r} has no split {name!r}; choose one of {', '.join(SPLITS)}")
        return self.splits[name]


def check_examples(examples: Examples, data: ClassificationData, split: str) -> None:
    """Raise a clear error when labels, token ids or lengths of a split break the dataset's limits."""
    where = f"the {split} split of {data.name!r}"
    if len(examples) == 0:
        raise DataError(f"{where} is empty; use more data or smaller held-out sizes")
    labels = examples.labels
    if labels.min() < 0 or labels.max() >= data.n_classes:
        raise DataError(f"{where} has label {int(labels.max())} outside [0, {data.n_classes}); the files are "
                        f"not in the expected format")
    if examples.lengths.max() > data.max_len:
        raise DataError(f"{where} has a sequence of {int(examples.lengths.max())} tokens, longer than max_len "
                        f"{data.max_len}")
    tokens = examples.tokens
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= data.vocab_size):
        raise DataError(f"{where} has token id {int(tokens.max())} outside [0, {data.vocab_size})")
