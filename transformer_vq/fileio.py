"""Durable writes and checksum manifests, shared by checkpoints and the dataset cache.

Atomic writes: a file or a directory is built under a temporary hidden name beside its final place
(same file system), every file is fsynced, then one ``rename`` puts it under its final name and the
parent directory is fsynced so the rename itself survives a power cut. A crash at any moment leaves
either the old content or the new one under the final name, never a half-written one; what it may
leave is *debris*: hidden ``.NAME.XXXX.tmp`` entries of interrupted writes and ``.trash-*`` entries
of interrupted deletions, which :func:`clean_debris` removes.

Deletion is the mirror image: :func:`remove_tree` first renames a directory out of the way (to a
``.trash-*`` name), then deletes it, so a deletion killed midway never leaves a half-deleted
directory under its real name.

Manifests record SHA-256 checksums written after the data, so damage done later (a truncated copy,
a bad disk) is detected on read: a per-file manifest ``NAME.json`` (size, checksum and any facts,
used by the dataset cache) or a per-directory ``manifest.json`` (``{file name: checksum}``, used by
checkpoints).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

# Read files in 4 MiB chunks when hashing: large enough to be fast, small enough to keep memory flat
# on multi-gigabyte files.
CHUNK = 4 << 20

TRASH_PREFIX = ".trash-"
# Temporary names of interrupted writes: ``.NAME.XXXX.tmp`` (and ``.NAME.tmp-PID``, the form older
# versions used for checkpoints).
_TEMP_NAME = re.compile(r"^\..+\.tmp(-\d+)?$")

DIR_MANIFEST = "manifest.json"


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make renames inside ``directory`` durable; not every platform can open a directory, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a binary file that appears at ``path`` only once the ``with`` block completes.

    The data goes to a uniquely named temporary file next to ``path`` (so concurrent writers of the
    same deterministic file, e.g. ``torchrun`` workers, never collide), which is fsynced and renamed
    over ``path`` on success and deleted on any exception.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates owner-only files; nothing written here is secret, make it readable like any file
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data)


def save_png(fig, path: str | os.PathLike, *, dpi: int, default_name: str | None = None) -> Path:
    """Write the matplotlib figure ``fig`` as a PNG at ``path`` (atomically) and return the path written, which is
    the one to print: exactly ``path`` (matplotlib alone would append ``.png`` to a name without a suffix, so the
    file would not be where a message said), or ``default_name`` inside ``path`` when ``path`` is a directory."""
    from transformer_vq.config.fields import png_path_problem

    problem = png_path_problem(path)
    if problem:
        raise ValueError(problem)
    path = Path(path)
    if path.is_dir():
        if default_name is None:
            raise IsADirectoryError(errno.EISDIR, "a directory where a PNG file was expected", str(path))
        path = path / default_name
    with atomic_writer(path) as handle:
        fig.savefig(handle, format="png", dpi=dpi)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces ``final`` once the ``with`` block completes.

    On success every file in it is fsynced, made readable like any file (:func:`make_readable`), and it is renamed
    to ``final`` (a directory already there, e.g. the same checkpoint saved again, is moved aside first and then
    removed); on any exception the temporary directory is deleted and ``final`` is untouched.
    """
    final = Path(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        for file in tmp.iterdir():
            if file.is_file():
                _fsync_file(file)
        make_readable(tmp)
        fsync_dir(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp creates owner-only directories
        old = _move_to_trash(final) if final.exists() else None
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def make_readable(directory: str | os.PathLike) -> None:
    """Give every file under ``directory`` the mode :func:`atomic_writer` gives its files (0644). Writers of other
    libraries may leave owner-only files (safetensors 0.8 writes ``model.safetensors`` through a private temporary
    file, 0600): in a shared model store nobody else could read the weights beside a readable config."""
    for path in Path(directory).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o644)


def _move_to_trash(path: Path) -> Path:
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{os.getpid()}")
    if trash.exists():
        shutil.rmtree(trash)
    os.rename(path, trash)
    fsync_dir(path.parent)
    return trash


def remove_tree(path: str | os.PathLike) -> None:
    """Delete directory ``path``: renamed out of its name first, so an interrupted deletion leaves
    only a ``.trash-*`` entry (removed by :func:`clean_debris`), never a half-deleted ``path``."""
    shutil.rmtree(_move_to_trash(Path(path)), ignore_errors=True)


def is_debris(name: str) -> bool:
    """Whether an entry name is left over from an interrupted atomic write or deletion."""
    return name.startswith(TRASH_PREFIX) or bool(_TEMP_NAME.match(name))


def clean_debris(directory: str | os.PathLike) -> list[Path]:
    """Remove the debris of interrupted writes and deletions directly inside ``directory``; returns
    what was removed. Only call it where no other process is writing (e.g. under a run's lock)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        if is_debris(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            removed.append(entry)
    return removed


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object stored at ``path``, or ``None`` when the file is missing or not valid JSON."""
    try:
        with open(path, "rb") as handle:
            obj = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def file_digests(path: str | os.PathLike, algorithms: tuple[str, ...] = ("sha256",)) -> dict[str, str]:
    """Hex digests of a file under several algorithms, computed in one pass over the file."""
    hashers = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's contents, read in chunks."""
    return file_digests(path, (algorithm,))[algorithm]


# ---- per-file manifests (the dataset cache) ---------------------------------------------------------


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


# ---- per-directory manifests (checkpoints) -----------------------------------------------------------


@dataclass(frozen=True)
class ManifestProblem:
    """Why a directory fails its manifest: ``kind`` is "no_manifest", "bad_manifest", "missing" or
    "checksum"; ``name`` is the file concerned."""

    kind: str
    name: str


def write_dir_manifest(directory: str | os.PathLike, names: Iterable[str]) -> dict:
    """Write ``directory/manifest.json`` with the SHA-256 of each of ``names``; returns it."""
    directory = Path(directory)
    manifest = {name: file_digest(directory / name) for name in names}
    (directory / DIR_MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def check_dir_manifest(directory: str | os.PathLike, names: Iterable[str]) -> ManifestProblem | None:
    """``None`` when every one of ``names`` in ``directory`` matches its checksum in the directory's
    manifest, else the first problem found."""
    directory = Path(directory)
    if not (directory / DIR_MANIFEST).is_file():
        return ManifestProblem("no_manifest", DIR_MANIFEST)
    manifest = read_json(directory / DIR_MANIFEST)
    if manifest is None:
        return ManifestProblem("bad_manifest", DIR_MANIFEST)
    for name in names:
        if not (directory / name).is_file():
            return ManifestProblem("missing", name)
        if manifest.get(name) != file_digest(directory / name):
            return ManifestProblem("checksum", name)
    return None
