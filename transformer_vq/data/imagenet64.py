"""``imagenet64``: downsampled ImageNet at 64x64 (Chrabaszcz et al., 2017), one byte per subpixel.

The release (https://image-net.org/download-images.php, "Downsampled ImageNet 64x64") comes as
``Imagenet64_train_part1_npz.zip`` + ``Imagenet64_train_part2_npz.zip`` (``train_data_batch_1``
... ``train_data_batch_10``, 1,281,167 images) and ``Imagenet64_val_npz.zip`` (``val_data``,
50,000 images), each an ``.npz`` with key ``data``: a ``uint8`` array of shape ``[N, 12288]``
stored channel-planar (4,096 red values in row-major order, then green, then blue), plus
``labels`` (unused here: the task is unconditional density estimation). The older pickled
variant (same names without ``.npz``, pickled dicts with the same keys) is read with an
unpickler that refuses anything but numpy arrays.

Each image becomes 12,288 tokens in raster order -- row, then column, then channel (R, G, B) --
so a sequence of 12,288 bytes is one image, as in the paper (vocabulary 256). Splits, following
the paper (Sec. 5.2.3): the official validation set is the *test* split (the official test set
is not public); *validation* is a held-out part of the training set: every 16th training image
(global index i with i % 16 == 15, 80,072 images, the paper's "about 80,000"); the remaining
1,201,095 images train. The images are converted once into flat byte files in the cache, batch by
batch (``.npz`` members are streamed in chunks), and memory-mapped.

The paper adds absolute sinusoidal position embeddings for images: ``metadata`` says so
(``absolute_positions``), together with the image shape.
"""

from __future__ import annotations

import os
import re
import zipfile
import zlib
from pathlib import Path
from typing import Annotated, Iterator

import numpy as np

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import Positive, Rules
from transformer_vq.data.progress import Advance, building, no_progress
from transformer_vq.data.safe_pickle import load_array_pickle

SIDE = 64
CHANNELS = 3
IMAGE_TOKENS = SIDE * SIDE * CHANNELS  # 12,288
TRAIN_BATCHES = 10
TRAIN_IMAGES = 1_281_167
TEST_IMAGES = 50_000
VALIDATION_EVERY = 16
GET_IT = ("download Imagenet64_train_part1_npz.zip, Imagenet64_train_part2_npz.zip and Imagenet64_val_npz.zip from "
          "https://image-net.org/download-images.php, unzip them into one directory and pass it with --data-path")
# Images converted per step: 4,096 x 12,288 bytes = 48 MiB of memory at a time.
CHUNK_IMAGES = 4096
_BATCH_NAME = re.compile(r"^train_data_batch_(\d+)(\.npz)?$")


def planar_to_raster(rows: np.ndarray) -> np.ndarray:
    """``[n, 12288]`` channel-planar rows -> ``[n, 12288]`` in (row, column, channel) order."""
    n = rows.shape[0]
    return np.ascontiguousarray(rows.reshape(n, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1)).reshape(n, IMAGE_TOKENS)


def raster_to_image(tokens: np.ndarray) -> np.ndarray:
    """One image's 12,288 raster-order tokens -> a ``[64, 64, 3]`` ``uint8`` array."""
    return np.asarray(tokens, dtype=np.uint8).reshape(SIDE, SIDE, CHANNELS)


def find_release_files(root: Path) -> tuple[list[Path], Path]:
    """The training batch files (ordered 1..K) and the validation file below ``root``.

    ``.npz`` files are preferred over the pickled variant when both exist. Raises
    :class:`DataError` when the validation file or any training batch in 1..K is missing.
    """
    if not root.is_dir():
        raise DataError(f"ImageNet64 path {root} is not a directory; {GET_IT}")
    batches: dict[int, Path] = {}
    val = None
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        match = _BATCH_NAME.match(path.name)
        if match:
            index = int(match.group(1))
            if index not in batches or path.suffix == ".npz":
                batches[index] = path
        elif path.name in ("val_data", "val_data.npz") and (val is None or path.suffix == ".npz"):
            val = path
    if not batches:
        raise DataError(f"no train_data_batch_* files under {root}; {GET_IT}")
    missing = [k for k in range(1, max(batches) + 1) if k not in batches]
    if missing:
        raise DataError(f"training batches {', '.join(f'train_data_batch_{k}' for k in missing)} are missing under "
                        f"{root}; {GET_IT}")
    if val is None:
        raise DataError(f"no val_data(.npz) under {root}: the official validation set is the test split; {GET_IT}")
    return [batches[k] for k in sorted(batches)], val


def _check_shape(path: Path, shape: tuple, dtype: np.dtype) -> None:
    if len(shape) != 2 or shape[1] != IMAGE_TOKENS or dtype != np.uint8:
        raise DataError(
            f"{path}: 'data' has shape {tuple(shape)} and dtype {dtype}, expected [N, {IMAGE_TOKENS}] uint8 "
            f"(64x64x3 channel-planar images); this is not the downsampled-ImageNet 64x64 release. {GET_IT}"
        )


def count_images(path: Path) -> int:
    """Number of images in one release file (reads only the array header of an ``.npz``)."""
    if path.suffix == ".npz":
        with _npz_data(path) as (shape, _):
            return int(shape[0])
    return int(_pickled_data(path).shape[0])


# What a damaged .npz raises, opening it or reading its member (a bad CRC surfaces only when the member is read)
NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError)


def corrupt_npz(path: Path, exc: BaseException) -> DataError:
    """The one message for an .npz file that cannot be read, whichever step found it."""
    return DataError(f"cannot read {path} as an .npz file ({exc}); it is corrupt: download it again")


class _npz_data:
    """Context manager: open member ``data.npy`` of an ``.npz`` and parse its header (no pickle)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        try:
            self.zip = zipfile.ZipFile(self.path)
            if "data.npy" not in self.zip.namelist():
                raise DataError(f"{self.path} has no 'data' array (keys: "
                                f"{', '.join(n.removesuffix('.npy') for n in self.zip.namelist())}); {GET_IT}")
            self.handle = self.zip.open("data.npy")
            version = np.lib.format.read_magic(self.handle)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran_order, dtype = reader(self.handle)
        except NPZ_ERRORS as exc:
            raise corrupt_npz(self.path, exc) from exc
        if fortran_order:
            raise DataError(f"{self.path}: 'data' is stored in Fortran order, unlike the release; {GET_IT}")
        _check_shape(self.path, shape, dtype)
        return shape, self.handle

    def __exit__(self, *exc):
        self.handle.close()
        self.zip.close()


def _pickled_data(path: Path) -> np.ndarray:
    obj = load_array_pickle(path)
    if not isinstance(obj, dict) or "data" not in obj:
        raise DataError(f"{path} does not hold a dict with key 'data'; {GET_IT}")
    data = obj["data"]
    if not isinstance(data, np.ndarray):
        raise DataError(f"{path}: 'data' is a {type(data).__name__}, not a numpy array; {GET_IT}")
    _check_shape(path, data.shape, data.dtype)
    return data


def iter_planar_chunks(path: Path, chunk: int = CHUNK_IMAGES) -> Iterator[np.ndarray]:
    """The images of one release file as ``[<=chunk, 12288]`` channel-planar ``uint8`` arrays.

    ``.npz`` files are streamed from the zip member; a pickled file is loaded whole (that is
    how the format works) with the restricted unpickler.
    """
    if path.suffix != ".npz":
        data = _pickled_data(path)
        for begin in range(0, data.shape[0], chunk):
            yield data[begin:begin + chunk]
        return
    with _npz_data(path) as (shape, handle):
        remaining = int(shape[0])
        while remaining:
            n = min(chunk, remaining)
            try:
                raw = handle.read(n * IMAGE_TOKENS)
            except NPZ_ERRORS as exc:
                raise corrupt_npz(path, exc) from exc
            if len(raw) != n * IMAGE_TOKENS:
                raise DataError(f"{path} is truncated ({remaining - len(raw) // IMAGE_TOKENS} images missing); "
                                "download it again")
            yield np.frombuffer(raw, dtype=np.uint8).reshape(n, IMAGE_TOKENS)
            remaining -= n


def convert(train_files: list[Path], val_file: Path, directory: Path, validation_every: int,
            advance: Advance = no_progress) -> dict:
    """Write ``train.bin``, ``validation.bin``, ``test.bin`` (raster bytes) into ``directory`` (``advance`` counts
    the images).

    Returns the image count per split; the files appear atomically and the counts are saved in
    ``directory/images.json`` last, which marks the conversion complete.
    """
    counts = {"train": 0, "validation": 0, "test": 0}
    with (fileio.atomic_writer(directory / "train.bin") as train,
          fileio.atomic_writer(directory / "validation.bin") as val):
        index = 0  # global index of the next training image
        for path in train_files:
            for rows in iter_planar_chunks(path):
                raster = planar_to_raster(rows)
                held_out = (np.arange(index, index + len(rows)) % validation_every) == validation_every - 1
                train.write(raster[~held_out].tobytes())
                val.write(raster[held_out].tobytes())
                counts["train"] += int((~held_out).sum())
                counts["validation"] += int(held_out.sum())
                index += len(rows)
                advance(len(rows))
    with fileio.atomic_writer(directory / "test.bin") as test:
        for rows in iter_planar_chunks(val_file):
            test.write(planar_to_raster(rows).tobytes())
            counts["test"] += len(rows)
            advance(len(rows))
    fileio.atomic_write_json(directory / "images.json", counts)
    return counts


def converted_dir(train_files: list[Path], val_file: Path, validation_every: int,
                  cache_dir: str | os.PathLike | None) -> Path:
    """The cache directory of a conversion, keyed by the release files' names, sizes and times."""
    key = cache.fingerprint([*train_files, val_file], validation_every=validation_every)
    return cache.dataset_dir("imagenet64", cache_dir) / key


def converted_counts(directory: Path) -> dict | None:
    """The image count per split of a complete conversion in ``directory``; None when there is none."""
    counts = fileio.read_json(directory / "images.json")
    if counts is None:
        return None
    for split in ("train", "validation", "test"):
        path = directory / f"{split}.bin"
        if not path.is_file() or path.stat().st_size != counts.get(split, -1) * IMAGE_TOKENS:
            return None
    return counts


def check_image_counts(root: Path, train_files: list[Path], val_file: Path, expected: tuple[int, int]) -> None:
    """Refuse an incomplete release before spending an hour converting it."""
    found = (sum(count_images(p) for p in train_files), count_images(val_file))
    if found != tuple(expected):
        raise DataError(
            f"{root} holds {found[0]:,} training and {found[1]:,} validation images; the release has "
            f"{expected[0]:,} and {expected[1]:,}: some files are incomplete. {GET_IT}"
        )


def load_imagenet64(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    validation_every: Annotated[int, Rules(min=2)] = VALIDATION_EVERY,
    expected_train_batches: Positive | None = TRAIN_BATCHES,
    expected_images: tuple[Positive, Positive] | None = (TRAIN_IMAGES, TEST_IMAGES),
) -> Corpus:
    """Load downsampled ImageNet 64x64 as bytes in raster order, converting it into the cache once.

    Args:
        data_path: a directory holding the unzipped release files (searched recursively).
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        validation_every: every this-many-th training image is held out for validation.
        expected_train_batches, expected_images: what the full release has (10 batches;
            1,281,167 training and 50,000 validation images); ``None`` skips the check (tests).
    """
    if data_path is None:
        raise DataError(f"--data imagenet64 needs the dataset: pass --data-path DIR; {GET_IT}")
    if validation_every < 2:
        raise DataError(f"validation_every={validation_every} would hold out every training image; use at least 2 "
                        f"(default {VALIDATION_EVERY})")
    root = Path(data_path).expanduser()
    train_files, val_file = find_release_files(root)
    if expected_train_batches is not None and len(train_files) != expected_train_batches:
        raise DataError(
            f"found train_data_batch_1..{len(train_files)} under {root}, but the release has "
            f"{expected_train_batches} batches: unzip both Imagenet64_train_part1 and part2 there. {GET_IT}"
        )
    directory = converted_dir(train_files, val_file, validation_every, cache_dir)
    counts = converted_counts(directory)
    if counts is None:
        total = sum(expected_images) if expected_images is not None else None  # what the check below makes sure of
        with building("imagenet64", directory, total, "image") as advance:
            if expected_images is not None:
                check_image_counts(root, train_files, val_file, expected_images)
            counts = convert(train_files, val_file, directory, validation_every, advance)
    for split, n in counts.items():
        if n == 0:
            raise DataError(f"the ImageNet64 {split} split is empty (too few images under {root}); {GET_IT}")
    splits = {split: np.memmap(directory / f"{split}.bin", dtype=np.uint8, mode="r") for split in counts}
    documents = {split: np.arange(0, n * IMAGE_TOKENS, IMAGE_TOKENS, dtype=np.int64) for split, n in counts.items()}
    return Corpus(
        name="imagenet64",
        splits=splits,
        vocab_size=256,
        documents=documents,
        metadata={
            "source": str(root.resolve()),
            "images": counts,
            "image_shape": [SIDE, SIDE, CHANNELS],
            "tokens_per_image": IMAGE_TOKENS,
            "token_order": "row, column, channel (RGB)",
            "validation": f"every {validation_every}th training image "
                          f"(index % {validation_every} == {validation_every - 1})",
            "test": "official validation set (val_data)",
            "absolute_positions": True,
            "tokenization": "bytes",
        },
    )
