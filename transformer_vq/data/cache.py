"""The user cache directory: where downloaded and derived dataset files live.

The directory is ``$TVQ_CACHE_DIR`` when set, else ``~/.cache/transformer-vq`` (an explicit
``cache_dir`` argument overrides both). Files are written atomically: into a temporary file in the
same directory, flushed and fsynced, then renamed over the final name. A crash therefore never
leaves a half-written file under its final name, and two processes (e.g. ``torchrun`` workers)
building the same deterministic file at once simply both rename identical content.

Every assembled file comes with a small JSON *manifest* recording its size and SHA-256, written
after the file itself; a file whose manifest is missing or disagrees is treated as absent
(derived files) or as an error (downloaded sources, see the loaders).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from transformer_vq.data.errors import DataError

ENV_VAR = "TVQ_CACHE_DIR"

# Read files in 4 MiB chunks when hashing or copying: large enough to be fast, small enough to
# keep memory flat on multi-gigabyte files.
CHUNK = 4 << 20


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: ``cache_dir`` if given, else ``$TVQ_CACHE_DIR``, else ``~/.cache/transformer-vq``."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get(ENV_VAR):
        root = Path(os.environ[ENV_VAR])
    else:
        root = Path.home() / ".cache" / "transformer-vq"
    return root.expanduser()


def dataset_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache sub-directory of dataset ``name``, created if needed (with a clear error if it can't be)."""
    path = cache_root(cache_dir) / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the cache directory {path} ({exc.strerror or exc}). "
            f"Set {ENV_VAR} to a writable directory, or pass --cache-dir DIR"
        ) from exc
    return path


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a binary file that appears at ``path`` only once the ``with`` block completes.

    The data goes to a temporary file next to ``path`` (same file system, so the final rename is
    atomic), which is fsynced and renamed over ``path`` on success and deleted on any exception.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates owner-only files; cached data is not secret, make it readable like any file
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable; not every platform lets us open a directory, which is fine.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object stored at ``path``, or ``None`` when the file is missing or not valid JSON."""
    try:
        with open(path, "rb") as handle:
            obj = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's contents, read in chunks."""
    return file_digests(path, (algorithm,))[algorithm]


def file_digests(path: str | os.PathLike, algorithms: tuple[str, ...] = ("sha256",)) -> dict[str, str]:
    """Hex digests of a file under several algorithms, computed in one pass over the file."""
    hashers = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def manifest_path(path: str | os.PathLike) -> Path:
    """Where the manifest of data file ``path`` lives: ``path`` with ``.json`` appended."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def write_manifest(path: str | os.PathLike, **facts) -> dict:
    """Record ``path``'s size and SHA-256 (plus any ``facts``) in its manifest; returns the manifest."""
    path = Path(path)
    manifest = {"file": path.name, "size": path.stat().st_size, "sha256": file_digest(path), **facts}
    atomic_write_json(manifest_path(path), manifest)
    return manifest


def verified_manifest(path: str | os.PathLike, *, full: bool = True) -> dict | None:
    """The manifest of ``path`` if the file exists and matches it, else ``None``.

    ``full=False`` checks only the size (for multi-gigabyte derived files, where re-hashing on
    every load would cost more than rebuilding on the rare corruption).
    """
    path = Path(path)
    manifest = read_json(manifest_path(path))
    if manifest is None or not path.is_file():
        return None
    if path.stat().st_size != manifest.get("size"):
        return None
    if full and file_digest(path) != manifest.get("sha256"):
        return None
    return manifest
