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
"""

from __future__ import annotations

import os
from pathlib import Path

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
            f"cannot create the cache directory {path} ({exc.strerror or exc}). "
            f"Set {ENV_VAR} to a writable directory, or pass --cache-dir DIR"
        ) from exc
    return path
