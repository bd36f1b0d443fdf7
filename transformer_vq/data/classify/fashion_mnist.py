"""``fashion-mnist``: Zalando's Fashion-MNIST as 784-token pixel sequences (sequential image classification).

Debian packages the release as ``dataset-fashion-mnist``: ``/usr/share/datasets/fashion-mnist/``
holds ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``
and ``t10k-labels-idx1-ubyte.gz`` (gzipped IDX files). With no ``data_path`` the package is fetched
with ``apt-get download`` (no root, nothing installed) and the four files are read out of it;
``data_path`` may instead be the ``.deb`` or a directory holding the four files (gzipped or not),
e.g. the original download. IDX: a big-endian header (magic ``0x00000803`` and three dimensions for
images, ``0x00000801`` and one for labels), then one unsigned byte per value.

Each 28x28 image becomes 784 tokens in raster order (row by row), token = gray level 0..255
(vocabulary 256). The 60,000 training images give the last ``validation_size`` (default 5,000) to
validation; the 10,000 test images are the test split. Converted once into the cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated

import numpy as np

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.classify.examples import ClassificationData, Examples, holdout
from transformer_vq.data.classify.store import cached_splits
from transformer_vq.data.debian import apt_download, read_deb_file
from transformer_vq.data.errors import DataError
from transformer_vq.data.formats import gunzip
from transformer_vq.data.options import WITH_PATH, WITHOUT_PATH, Positive

PACKAGE = "dataset-fashion-mnist"
DEB_DIR = "usr/share/datasets/fashion-mnist"
FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
SIZES = {"train": 60_000, "test": 10_000}
SIDE = 28
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
# SHA-256 of the Debian 12 package file, checked when that file is used.
KNOWN_PACKAGES = {"dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb":
                  "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"}
INSTEAD = f"pass --data-path with {PACKAGE}_*.deb or a directory holding the four Fashion-MNIST IDX files"
# SHA-256 of each IDX file of the release, decompressed (read from the Debian package above, 2026-11-29): checked for
# a directory given as --data-path, where MNIST's files, named alike, would otherwise train as Fashion-MNIST
RELEASE_SHA256 = {"train_images": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                  "train_labels": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
                  "test_images": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                  "test_labels": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"}


def parse_idx(raw: bytes, name: str, *, images: bool) -> np.ndarray:
    """``[N, 28 * 28]`` pixels (``images``) or ``[N]`` labels from the (decompressed) bytes of one IDX file."""
    magic, n_dims = (IMAGE_MAGIC, 3) if images else (LABEL_MAGIC, 1)
    header = 4 + 4 * n_dims
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        found = raw[:4].hex() if len(raw) >= 4 else "nothing"
        raise DataError(f"{name}: magic number {found}, expected {magic:08x} (an IDX file of unsigned bytes with "
                        f"{n_dims} dimension{'s' * (n_dims > 1)}); {INSTEAD}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(n_dims)]
    if images and dims[1:] != [SIDE, SIDE]:
        raise DataError(f"{name}: images are {dims[1]}x{dims[2]}, expected {SIDE}x{SIDE}; {INSTEAD}")
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise DataError(f"{name}: {len(raw):,} bytes, expected {expected:,} for dimensions {dims}; the file is "
                        f"truncated or corrupt: {INSTEAD}")
    values = np.frombuffer(raw, dtype=np.uint8, offset=header)
    return values.reshape(dims[0], SIDE * SIDE) if images else values


def read_release(source: Path, use_dpkg: bool | None = None) -> dict[str, bytes]:
    """The raw bytes of the four IDX files, from a ``.deb`` or a directory."""
    if source.suffix == ".deb":
        sha256 = fileio.file_digest(source)
        known = KNOWN_PACKAGES.get(source.name)
        if known is not None and sha256 != known:
            raise DataError(f"checksum mismatch for {source}: sha256 {sha256}, expected {known} for this Debian "
                            f"release. The file is corrupt: delete it and run again, or {INSTEAD}")
        return {key: read_deb_file(source, f"{DEB_DIR}/{name}.gz", use_dpkg=use_dpkg) for key, name in FILES.items()}
    folder = release_folder(source)
    return {key: _idx_file(folder, name).read_bytes() for key, name in FILES.items()}


def _idx_file(folder: Path, name: str) -> Path:
    """``name.gz`` in ``folder`` if there is one, else ``name``."""
    return folder / f"{name}.gz" if (folder / f"{name}.gz").is_file() else folder / name


def release_folder(source: Path) -> Path:
    """The one folder at or below ``source`` that holds all four IDX files (each plain or ``.gz``): files taken from
    different folders could mix two datasets; several such folders are refused by name."""
    holding = sorted({path.parent for name in FILES.values() for path in source.rglob(f"{name}*")
                      if path.name in (name, f"{name}.gz")})
    whole = [folder for folder in holding if all(_idx_file(folder, name).is_file() for name in FILES.values())]
    if len(whole) == 1:
        return whole[0]
    if whole:
        raise DataError(f"{len(whole)} folders under {source} hold the four IDX files ({', '.join(map(str, whole))}); "
                        f"pass the one to read as --data-path")
    have = {name for folder in holding for name in FILES.values() if _idx_file(folder, name).is_file()}
    lacking = [name for name in FILES.values() if name not in have] or list(FILES.values())
    where = "" if not holding else f" (parts of it are in {', '.join(map(str, holding))})"
    raise DataError(f"no folder under {source} holds all four IDX files: no {lacking[0]}(.gz) beside the "
                    f"others{where}; {INSTEAD}")


def check_release(raw: dict[str, bytes], source: Path) -> None:
    """Refuse IDX files (decompressed) that are not Fashion-MNIST's release, by their SHA-256."""
    for key, expected in RELEASE_SHA256.items():
        digest = hashlib.sha256(raw[key]).hexdigest()
        if digest != expected:
            raise DataError(f"{FILES[key]} in {release_folder(source)} is not Fashion-MNIST's (sha256 {digest}, "
                            f"expected {expected}): MNIST's files have the same names. For another copy in this "
                            f"format, pass --data-option release_checksums=false")


def find_source(data_path, cache_dir, apt_command) -> Path:
    """The package or directory to read: ``data_path``, else a cached or freshly fetched package."""
    if data_path is not None:
        path = Path(data_path).expanduser()
        if not path.exists():
            raise DataError(f"{path} does not exist; {INSTEAD}")
        return path
    download = cache.dataset_dir("fashion-mnist", cache_dir) / "download"
    cached = sorted(download.glob(f"{PACKAGE}_*.deb"))
    return cached[-1] if cached else apt_download(PACKAGE, download, command=apt_command)


def convert(source: Path, use_dpkg: bool | None, release_checksums: bool = True) -> dict[str, Examples]:
    """Train (all 60,000 in the release) and test examples read from ``source``; validation is cut later."""
    raw = {key: gunzip(data, FILES[key], INSTEAD) for key, data in read_release(source, use_dpkg).items()}
    if release_checksums and source.suffix != ".deb":  # a package is checked by its own checksum
        check_release(raw, source)
    splits = {}
    for split in ("train", "test"):
        images = parse_idx(raw[f"{split}_images"], FILES[f"{split}_images"], images=True)
        labels = parse_idx(raw[f"{split}_labels"], FILES[f"{split}_labels"], images=False)
        if len(images) != len(labels):
            raise DataError(f"{source}: {len(images):,} {split} images but {len(labels):,} labels (the release has "
                            f"{SIZES[split]:,} of each); {INSTEAD}")
        splits[split] = Examples.fixed(images, labels)
    return splits


def load_fashion_mnist(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                       validation_size: Positive = 5_000,
                       apt_command: Annotated[tuple[str, ...], WITHOUT_PATH] | None = None,
                       use_dpkg: bool | None = None,
                       release_checksums: Annotated[bool, WITH_PATH] = True) -> ClassificationData:
    """Fashion-MNIST as 784-token sequences (10 classes), fetched with apt on first use.

    ``release_checksums``: a folder given as ``data_path`` must hold the release's four files (their SHA-256); false
    reads another copy in the same format."""
    source = find_source(data_path, cache_dir, apt_command)
    stored = cached_splits("fashion-mnist", [source], {"format": 1, "release_checksums": release_checksums},
                           lambda *_: convert(source, use_dpkg, release_checksums), cache_dir,
                           splits=("train", "test"))
    train, validation = holdout(stored["train"], validation_size, "fashion-mnist")
    return ClassificationData("fashion-mnist", {"train": train, "validation": validation, "test": stored["test"]},
                              vocab_size=256, n_classes=10, max_len=SIDE * SIDE, class_names=CLASS_NAMES,
                              metadata={"source": str(source), "image_shape": [SIDE, SIDE, 1],
                                        "validation_size": validation_size})
