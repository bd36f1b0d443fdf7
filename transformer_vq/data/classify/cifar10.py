"""``cifar10``: CIFAR-10 from its "python version" release, as pixel sequences (LRA Image).

The release (``cifar-10-python.tar.gz``, unpacked to ``cifar-10-batches-py/``) holds
``data_batch_1`` .. ``data_batch_5`` (10,000 training images each) and ``test_batch`` (10,000),
each a pickled dict with ``data`` (a ``uint8`` array ``[10000, 3072]``: the 1,024 red values of a
32x32 image in row-major order, then green, then blue) and ``labels`` (10,000 ints 0..9), plus
``batches.meta`` (``label_names``). The pickles are read with an unpickler that builds nothing
but numpy arrays and plain containers.

As in LRA Image, an image is by default converted to gray levels the way TensorFlow's
``rgb_to_grayscale`` does (``0.2989 R + 0.5870 G + 0.1140 B`` in float32 on values scaled to
[0, 1], then ``floor(x * 255.5)``) and read as 1,024 tokens in raster order; ``grayscale=False``
keeps colour: 3,072 tokens in (row, column, channel) order. Vocabulary 256 either way. The last
``validation_size`` (default 5,000) training images validate; ``test_batch`` is the test split.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from transformer_vq.data.classify.examples import ClassificationData, Examples, holdout
from transformer_vq.data.classify.release import find_release_files
from transformer_vq.data.classify.store import cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import Positive
from transformer_vq.data.safe_pickle import load_array_pickle

SIDE = 32
CHANNELS = 3
PIXELS = SIDE * SIDE
BATCH_IMAGES = 10_000
TRAIN_FILES = tuple(f"data_batch_{k}" for k in range(1, 6))
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
GET_IT = ("download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and pass "
          "the cifar-10-batches-py directory with --data-path")


def to_grayscale(planar: np.ndarray) -> np.ndarray:
    """``[n, 3072]`` channel-planar RGB -> ``[n, 1024]`` gray levels, as TensorFlow's ``rgb_to_grayscale``."""
    rgb = planar.reshape(-1, CHANNELS, PIXELS).astype(np.float32) / np.float32(255)
    gray = np.tensordot(GRAY_WEIGHTS, rgb, axes=([0], [1]))  # (n, 1024)
    return np.clip(np.floor(gray * np.float32(255.5)), 0, 255).astype(np.uint8)


def to_raster(planar: np.ndarray) -> np.ndarray:
    """``[n, 3072]`` channel-planar RGB -> ``[n, 3072]`` in (row, column, channel) order."""
    n = planar.shape[0]
    return np.ascontiguousarray(planar.reshape(n, CHANNELS, PIXELS).transpose(0, 2, 1)).reshape(n, CHANNELS * PIXELS)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(data [N, 3072] uint8, labels [N] int64)`` of one release batch file, checked."""
    batch = load_array_pickle(path, instead=f"The release's batches hold only arrays and lists: {GET_IT}")
    if isinstance(batch, dict):
        # Python 2 pickles (the release) have str keys once decoded; Python 3 ones may have bytes keys.
        batch = {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in batch.items()}
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        raise DataError(f"{path} is not a CIFAR-10 batch (a pickled dict with 'data' and 'labels'); {GET_IT}")
    data, labels = batch["data"], np.asarray(batch["labels"])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * PIXELS:
        shape = getattr(data, "shape", None)
        raise DataError(f"{path}: 'data' has shape {shape} and dtype {getattr(data, 'dtype', type(data).__name__)}, "
                        f"expected [N, 3072] uint8 (32x32 RGB, channel-planar); {GET_IT}")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer) or \
            (len(labels) and (labels.min() < 0 or labels.max() > 9)):
        raise DataError(f"{path}: 'labels' must be {len(data)} integers 0..9; {GET_IT}")
    return data, labels.astype(np.int64)


def find_release(data_path: str | os.PathLike | None) -> dict[str, list[Path]]:
    """The training batch files (in order) and the test batch under ``data_path``."""
    names = {name: name for name in TRAIN_FILES + ("test_batch",)}
    found = find_release_files(data_path, names, what="cifar10", get_it=GET_IT)
    return {"train": [found[name] for name in TRAIN_FILES], "test": [found["test_batch"]]}


def convert(files: dict[str, list[Path]], grayscale: bool) -> dict[str, Examples]:
    """Train and test examples from the release batch files."""
    splits = {}
    for split, paths in files.items():
        batches = [read_batch(path) for path in paths]
        data = np.concatenate([d for d, _ in batches])
        splits[split] = Examples.fixed(to_grayscale(data) if grayscale else to_raster(data),
                                       np.concatenate([labels for _, labels in batches]))
    return splits


def load_cifar10(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                 grayscale: bool = True, validation_size: Positive = 5_000) -> ClassificationData:
    """CIFAR-10 as 1,024 gray (default, LRA Image) or 3,072 RGB tokens per image (10 classes)."""
    files = find_release(data_path)
    inputs = [p for paths in files.values() for p in paths]
    stored = cached_splits("cifar10", inputs, {"grayscale": bool(grayscale), "format": 1},
                           lambda *_: convert(files, grayscale), cache_dir, splits=("train", "test"))
    train, validation = holdout(stored["train"], validation_size, "cifar10")
    channels = 1 if grayscale else CHANNELS
    return ClassificationData("cifar10", {"train": train, "validation": validation, "test": stored["test"]},
                              vocab_size=256, n_classes=10, max_len=PIXELS * channels, class_names=CLASS_NAMES,
                              metadata={"source": str(Path(data_path)), "image_shape": [SIDE, SIDE, channels],
                                        "grayscale": bool(grayscale), "validation_size": validation_size})
