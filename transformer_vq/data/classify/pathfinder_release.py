"""The released Pathfinder images of LRA (``pathfinder32`` .. ``pathfinder256``; Path-X is ``pathfinder128``).

Layout of one resolution directory (e.g. ``lra_release/pathfinder32``): a folder per difficulty --
``curv_baseline`` (easy), ``curv_contour_length_9`` (intermediate), ``curv_contour_length_14``
(hard, the one LRA reports) -- each holding ``imgs/<k>/sample_<j>.png`` (grayscale PNGs) and
``metadata/<k>.npy``. Despite their suffix the metadata files are text: one line per image whose
space-separated fields are the image folder (``imgs/<k>``), the file name (``sample_<j>.png``), an
index, and the label (1: the dots are connected), then further generator settings. Images are
taken in the order of the metadata files (numerically by ``k``) and their lines; the first 80%
train, the next 10% validate, the last 10% test. Decoded once into the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.classify.store import cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.progress import Advance, no_progress
from transformer_vq.data.splits import split_bounds

CLASS_NAMES = ("disconnected", "connected")  # label 0 and 1, in the release's metadata as in the generator's
DIFFICULTIES = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
FRACTIONS = (0.8, 0.1, 0.1)
GET_IT = ("pass --data-path with a resolution directory of LRA's release (e.g. lra_release/pathfinder32, holding "
          "curv_contour_length_14/) or with one difficulty folder (holding metadata/ and imgs/)")


def difficulty_dir(data_path: str | os.PathLike, difficulty: str) -> Path:
    """The folder holding ``metadata/`` and ``imgs/`` for ``difficulty`` under ``data_path``."""
    if difficulty not in DIFFICULTIES:
        raise DataError(f"unknown pathfinder difficulty {difficulty!r}; choose one of {', '.join(DIFFICULTIES)}")
    root = Path(data_path).expanduser()
    for candidate in (root / DIFFICULTIES[difficulty], root):
        if (candidate / "metadata").is_dir():
            return candidate
    raise DataError(f"no metadata/ folder in {root} or {root / DIFFICULTIES[difficulty]}; {GET_IT}")


def _number(stem: str) -> bool:
    """Whether ``stem`` reads as a number: isdigit() alone also accepts digits int() refuses ("²")."""
    return stem.isascii() and stem.isdigit()


def read_metadata(folder: Path) -> list[tuple[Path, int]]:
    """``(image path, label)`` of every line of every metadata file, in order."""
    files = sorted((folder / "metadata").glob("*.npy"), key=lambda p: (not _number(p.stem), int(p.stem)
                                                                       if _number(p.stem) else 0, p.name))
    entries = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise DataError(f"{path}:{number}: expected 'imgs/<k> sample_<j>.png <index> <label 0|1> ...', "
                                f"got {line[:60]!r}; {GET_IT}")
            entries.append((folder / fields[0] / fields[1], int(fields[3])))
    if not entries:
        raise DataError(f"no metadata lines under {folder / 'metadata'}; {GET_IT}")
    return entries


def read_image(path: Path) -> np.ndarray:
    """One released image as a ``[side, side]`` ``uint8`` gray array."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as exc:
        raise DataError(f"cannot read image {path} ({exc}); the release is incomplete or corrupt: {GET_IT}") from exc
    if pixels.ndim != 2 or pixels.shape[0] != pixels.shape[1]:
        raise DataError(f"{path} is {pixels.shape}, expected a square grayscale image; {GET_IT}")
    return pixels


def convert(entries: list[tuple[Path, int]], advance: Advance = no_progress) -> dict[str, Examples]:
    """Decode every image (``advance`` counts them) and cut the list 80/10/10 into the splits."""
    first = read_image(entries[0][0])
    images = np.zeros((len(entries), first.size), dtype=np.uint8)
    for i, (path, _) in enumerate(entries):
        pixels = first if i == 0 else read_image(path)
        if pixels.shape != first.shape:
            raise DataError(f"{path} is {pixels.shape[0]}x{pixels.shape[1]}, but {entries[0][0]} is "
                            f"{first.shape[0]}x{first.shape[1]}; mixed resolutions: {GET_IT}")
        images[i] = pixels.reshape(-1)
        advance(1)
    labels = np.array([label for _, label in entries], dtype=np.int64)
    bounds = split_bounds(len(entries), FRACTIONS, name="the pathfinder release", min_split_tokens=1)
    return {split: Examples.fixed(images[a:b], labels[a:b]) for split, (a, b) in bounds.items()}


def load_release(data_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 difficulty: str = "hard") -> ClassificationData:
    """The released Pathfinder images of one difficulty as ``side * side``-token sequences (2 classes)."""
    folder = difficulty_dir(data_path, difficulty)
    entries = read_metadata(folder)
    # the whole folder: its metadata and every image they name
    splits = cached_splits("pathfinder", [folder], {"format": 1}, lambda _, advance: convert(entries, advance),
                           cache_dir, total=len(entries), unit="image")
    side = int(round(np.sqrt(splits["train"].lengths[0])))
    return ClassificationData("pathfinder", splits, vocab_size=256, n_classes=2, max_len=side * side,
                              class_names=CLASS_NAMES,
                              metadata={"generated": False, "source": str(folder), "difficulty": difficulty,
                                        "image_shape": [side, side, 1]})
