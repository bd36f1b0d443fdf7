"""``digits``: scikit-learn's bundled 8x8 handwritten digits as 64-token pixel sequences.

The data (1,797 images, the test part of the UCI "Optical Recognition of Handwritten Digits"
set) ships inside scikit-learn (``sklearn.datasets.load_digits``), so it needs no download; install
it with the ``digits`` extra (``pip install -e ".[digits]"`` in the checkout). Each image is 64 tokens in
raster order, token = gray level 0..16 (vocabulary 17). There is no official split: a permutation
drawn from ``seed`` puts ``test_size`` images in test, ``validation_size`` in validation and the
rest (1,257 by default) in train.
"""

from __future__ import annotations

import os

import numpy as np

from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import NonNegative, Positive

SIDE = 8
LEVELS = 17  # gray levels 0..16


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``([1797, 64] int pixels, [1797] labels)`` from scikit-learn (``DataError`` naming the extra if absent)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise DataError("the digits dataset ships with scikit-learn, which is not installed; install the extra: "
                        "pip install -e '.[digits]' in the checkout (or pip install scikit-learn)") from exc
    bunch = load_digits()
    return np.rint(bunch.data).astype(np.uint8), np.asarray(bunch.target, dtype=np.int64)


def load_digits_data(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                     seed: NonNegative = 0, validation_size: Positive = 180,
                     test_size: Positive = 360) -> ClassificationData:
    """The 8x8 digits as 64-token sequences (10 classes), split by a permutation drawn from ``seed``."""
    if data_path is not None:
        raise DataError("the digits dataset ships with scikit-learn and takes no --data-path; leave it out")
    pixels, labels = load_digits_arrays()
    if validation_size < 1 or test_size < 1 or validation_size + test_size >= len(labels):
        raise DataError(f"digits: validation_size and test_size must be positive and leave training images "
                        f"(there are {len(labels)}), got {validation_size} and {test_size}")
    order = np.random.default_rng(seed).permutation(len(labels))
    parts = {"test": order[:test_size], "validation": order[test_size:test_size + validation_size],
             "train": order[test_size + validation_size:]}
    splits = {split: Examples.fixed(pixels[idx], labels[idx]) for split, idx in parts.items()}
    return ClassificationData("digits", splits, vocab_size=LEVELS, n_classes=10, max_len=SIDE * SIDE,
                              class_names=tuple(str(d) for d in range(10)),
                              metadata={"source": "sklearn.datasets.load_digits", "seed": seed,
                                        "image_shape": [SIDE, SIDE, 1]})
