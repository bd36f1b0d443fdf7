"""One entry point for every classification dataset: ``load_classification(name, data_path=..., **options)``.

The names are the ``--data`` values of the classification command (``CLASSIFY_DATASETS`` in
:mod:`transformer_vq.config.choices`). Loaders are imported lazily; unknown names and options are
:class:`~transformer_vq.data.errors.DataError` with the valid choices in the message.
docs/datasets.md describes every dataset.
"""

from __future__ import annotations

import importlib
import os

from transformer_vq.data.classify.examples import ClassificationData
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import identity
from transformer_vq.data.registry import call_loader

PACKAGE = "transformer_vq.data.classify"
# name -> (module, loader function, one-line description)
DATASETS = {
    "listops": ("listops_data", "load_listops",
                "LRA ListOps: generated (LRA's rules, 96k/2k/2k) or the released TSV files; 10 classes, <2,000 tokens"),
    "fashion-mnist": ("fashion_mnist", "load_fashion_mnist",
                      "Fashion-MNIST via apt (dataset-fashion-mnist), 784 pixel tokens, 55k/5k/10k, 10 classes"),
    "digits": ("digits", "load_digits_data",
               "scikit-learn's 8x8 digits (extra 'digits'), 64 pixel tokens, 1,257/180/360, 10 classes"),
    "cifar10": ("cifar10", "load_cifar10",
                "CIFAR-10 python batches (--data-path), 1,024 gray tokens (LRA Image) or 3,072 RGB, 10 classes"),
    "pathfinder": ("pathfinder", "load_pathfinder",
                   "Pathfinder-style generated images (32x32 by default) or the LRA release folders, 2 classes"),
    "imdb": ("imdb", "load_imdb", "IMDB reviews (aclImdb, --data-path), bytes up to 4,096 (LRA Text), 2 classes"),
    "aan": ("aan", "load_aan", "LRA Retrieval AAN pairs (--data-path), one byte sequence per pair, 2 classes"),
}


def list_classification() -> dict[str, str]:
    """Every name ``load_classification`` accepts, mapped to a one-line description."""
    return {name: description for name, (_, _, description) in DATASETS.items()}


def classification_loader(name: str):
    """The loader function of dataset ``name`` (``DataError`` for an unknown name)."""
    if name not in DATASETS:
        raise DataError(f"unknown classification dataset {name!r}; choose one of: {', '.join(DATASETS)} "
                        f"(e.g. --data listops)")
    module, function, _ = DATASETS[name]
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), function)


def load_classification(name: str, *, data_path: str | os.PathLike | None = None,
                        cache_dir: str | os.PathLike | None = None, **options) -> ClassificationData:
    """Load classification dataset ``name`` (see :func:`list_classification`).

    Args:
        name: one of ``CLASSIFY_DATASETS``.
        data_path: where the released files are (per dataset); optional for the generated
            (listops, pathfinder) and fetched or bundled (fashion-mnist, digits) datasets.
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        options: dataset-specific keyword options (sizes, lengths, seeds, ``grayscale``, ``side``, ...).

    Raises:
        DataError: with a message naming the problem and the fix.
    """
    data = call_loader(name, classification_loader(name), data_path, cache_dir, options)
    data.identity = dataset_identity(name, data_path, options)
    return data


def dataset_identity(name: str, data_path: str | os.PathLike | None = None, options: dict | None = None) -> dict:
    """What identifies the dataset ``load_classification(name, data_path=data_path, **options)`` loads
    (:attr:`ClassificationData.identity`): ``data``, ``data_path`` (resolved) and ``data_options`` (every option,
    the defaults filled in). Equal for two calls that load the same data, whichever options they left at their
    defaults."""
    return identity(name, classification_loader(name), data_path, options or {})
