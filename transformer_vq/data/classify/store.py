"""Generated or converted classification splits, built once and memory-mapped from the cache.

Generating 100,000 ListOps expressions or decoding 200,000 Pathfinder PNGs takes minutes; the
result depends only on the input files and options, so it is written once into the dataset's cache
directory, under their :func:`~transformer_vq.data.cache.fingerprint`, and memory-mapped afterwards. Each
split is three ``.npy`` files (``tokens``, ``offsets``, ``labels``: an
:class:`~transformer_vq.data.classify.examples.Examples`) in a directory written atomically with a
checksum manifest; a directory that fails its manifest is rebuilt. A build says so, and how far it has come
(:func:`~transformer_vq.data.progress.building`); a load from the cache says nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from transformer_vq import fileio
from transformer_vq.config.choices import SPLITS
from transformer_vq.data import cache
from transformer_vq.data.classify.examples import Examples
from transformer_vq.data.progress import Advance, building

PARTS = ("tokens", "offsets", "labels")


class ExamplesWriter:
    """Labelled sequences appended one by one to a raw token file, so that a split larger than memory
    (LRA's AAN pairs: gigabytes) is built while its source file is read line by line.

    Use as a context manager (the file is closed however the block ends), then :meth:`finish`.
    """

    def __init__(self, path: Path, dtype):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.handle = open(self.path, "wb")
        self.offsets = [0]
        self.labels: list[int] = []

    def __enter__(self) -> "ExamplesWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()

    def __len__(self) -> int:
        return len(self.labels)

    def append(self, tokens, label: int) -> None:
        """Add one sequence and its label."""
        data = np.asarray(tokens, dtype=self.dtype)
        self.handle.write(data.tobytes())
        self.offsets.append(self.offsets[-1] + len(data))
        self.labels.append(int(label))

    def finish(self) -> Examples:
        """The examples written, their tokens memory-mapped from the file."""
        self.handle.close()
        tokens = np.memmap(self.path, dtype=self.dtype, mode="r") if self.offsets[-1] else np.zeros(0, self.dtype)
        return Examples(tokens, np.array(self.offsets, dtype=np.int64), np.array(self.labels, dtype=np.int64))


def cached_splits(name: str, inputs: Iterable[Path], options: Mapping,
                  build: Callable[[Path, Advance], Mapping[str, Examples]], cache_dir: str | os.PathLike | None = None,
                  splits: tuple[str, ...] = SPLITS, *, total: int | None = None,
                  unit: str | None = None) -> dict[str, Examples]:
    """The ``splits`` of ``name`` built by ``build(scratch, advance)`` from the files ``inputs`` (a directory: every
    file below it) with ``options``: from the cache when present and intact, else built, saved and then
    memory-mapped. ``scratch`` is a directory for :class:`ExamplesWriter` files, removed once the splits are saved;
    ``advance(n)`` counts ``n`` more of the build's ``total`` items of ``unit`` (None: a build too quick to count)."""
    inputs = list(inputs)
    root = cache.dataset_dir(name, cache_dir)
    directory = root / cache.fingerprint(inputs, **options)
    names = [f"{split}.{part}.npy" for split in splits for part in PARTS]
    if not directory.is_dir() or fileio.check_dir_manifest(directory, names) is not None:
        with tempfile.TemporaryDirectory(prefix=".scratch-", dir=root) as scratch, \
                fileio.atomic_directory(directory) as tmp:
            with building(name, directory, total, unit) as advance:
                built = build(Path(scratch), advance)
            for split in splits:
                for part in PARTS:  # np.save writes a memory map through, without loading it
                    np.save(tmp / f"{split}.{part}.npy", getattr(built[split], part))
            key = {"inputs": cache.input_listing(inputs), "options": options}  # for a reader of the cache
            (tmp / "key.json").write_text(json.dumps(key, sort_keys=True, default=str, indent=2))
            fileio.write_dir_manifest(tmp, names)
    return {split: Examples(*(np.load(directory / f"{split}.{part}.npy", mmap_mode="r") for part in PARTS))
            for split in splits}
