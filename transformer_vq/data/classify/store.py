"""Generated or converted classification splits, built once and memory-mapped from the cache.

Generating 100,000 ListOps expressions or decoding 200,000 Pathfinder PNGs takes minutes; the
result depends only on the inputs and options, so it is written once into the dataset's cache
directory, under a name derived from those options (``key``), and memory-mapped afterwards. Each
split is three ``.npy`` files (``tokens``, ``offsets``, ``labels``: an
:class:`~transformer_vq.data.classify.examples.Examples`) in a directory written atomically with a
checksum manifest; a directory that fails its manifest is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Mapping

import numpy as np

from transformer_vq import fileio
from transformer_vq.config.choices import SPLITS
from transformer_vq.data import cache
from transformer_vq.data.classify.examples import Examples

PARTS = ("tokens", "offsets", "labels")


def store_key(key: Mapping) -> str:
    """A short stable name for the options ``key`` (JSON-serializable)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached_splits(name: str, key: Mapping, build: Callable[[], Mapping[str, Examples]],
                  cache_dir: str | os.PathLike | None = None, splits: tuple[str, ...] = SPLITS,
                  ) -> dict[str, Examples]:
    """The ``splits`` of ``name`` built by ``build()`` for options ``key``: from the cache when
    present and intact, else built, saved and then memory-mapped."""
    directory = cache.dataset_dir(name, cache_dir) / store_key(key)
    names = [f"{split}.{part}.npy" for split in splits for part in PARTS]
    if not directory.is_dir() or fileio.check_dir_manifest(directory, names) is not None:
        built = build()
        with fileio.atomic_directory(directory) as tmp:
            for split in splits:
                for part in PARTS:
                    np.save(tmp / f"{split}.{part}.npy", getattr(built[split], part))
            (tmp / "key.json").write_text(json.dumps(key, sort_keys=True, default=str, indent=2))
            fileio.write_dir_manifest(tmp, names)
    return {split: Examples(*(np.load(directory / f"{split}.{part}.npy", mmap_mode="r") for part in PARTS))
            for split in splits}
