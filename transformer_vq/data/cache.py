"""The user cache directory: where downloaded and derived dataset files live.

The directory is ``$TVQ_CACHE_DIR`` when set, else ``~/.cache/transformer-vq`` (an explicit
``cache_dir`` argument overrides both). Files are written atomically with
:func:`transformer_vq.fileio.atomic_writer`: a crash never leaves a half-written file under its final
name, and two processes (e.g. ``torchrun`` workers) building the same deterministic file at once
simply both rename identical content.

Every assembled file comes with a small JSON *manifest* recording its size and SHA-256
(:func:`transformer_vq.fileio.write_manifest`), written after the file itself; a file whose manifest
is missing or disagrees is treated as absent (derived files) or as an error (downloaded sources, see
the loaders).

Every derived file or directory (a concatenated text tree, a tokenized split, a trained tokenizer, converted
classification splits) lives under a name given by :func:`fingerprint`: a hash of every input file it was built
from, by path, size and modification time (a directory input stands for every file below it, however deep), and
of every option that shapes it. A changed input or option therefore names another entry, and the stale one is
not read; an input rewritten with its size and modification time both kept (``cp -p`` of another version) is not
seen as changed: the key reads no contents, so that a large input is not hashed on every load.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from transformer_vq.data.errors import DataError

ENV_VAR = "TVQ_CACHE_DIR"


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
            f"cannot create the cache directory {path} ({exc.strerror or exc}). {_writable_hint(cache_dir)}"
        ) from exc
    return path


def _writable_hint(cache_dir: str | os.PathLike | None) -> str:
    """What chooses another cache root, in the words every caller shares: only ``tvq tokenizer`` has a
    ``--cache-dir`` flag (``tvq train`` has none), so a command-line flag is not named here."""
    if cache_dir is not None:  # the caller's own choice, which $TVQ_CACHE_DIR would not override
        return "The cache directory given (cache_dir) must be writable: give another"
    set_to = os.environ.get(ENV_VAR)
    where = f"it is {set_to}" if set_to else "unset: the default is ~/.cache/transformer-vq"
    return f"Set {ENV_VAR} to a writable directory ({where})"


def input_listing(inputs: Iterable[str | os.PathLike]) -> list[list]:
    """``[path, size, modification time in ns]`` of every file ``inputs`` stand for: a file itself, a directory
    every file below it (recursively, in path order, hidden files included: a reader may use any of them)."""
    listing = []
    for given in inputs:
        path = Path(given).expanduser().resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            listing.append([str(file), stat.st_size, stat.st_mtime_ns])
    return listing


def fingerprint(inputs: Iterable[str | os.PathLike] = (), **options) -> str:
    """The cache key of something built from the files ``inputs`` (see :func:`input_listing`) with ``options``
    (JSON-serializable; every option that changes the result, including a format version): 20 hex digits that
    change when any input file is added, removed, resized or touched, or any option changes."""
    text = json.dumps([input_listing(inputs), options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
