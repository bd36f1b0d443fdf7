"""Finding the files of a released dataset under a user's ``--data-path``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from transformer_vq.data.errors import DataError


def find_release_files(data_path: str | os.PathLike | None, names: Mapping[str, str], *, what: str,
                       get_it: str) -> dict[str, Path]:
    """Key -> the first file called ``names[key]`` below directory ``data_path`` (searched recursively).

    Raises :class:`DataError` ending with ``get_it`` (how to obtain the files) when ``data_path`` is
    missing, is not a directory, or lacks one of the files.
    """
    if data_path is None:
        raise DataError(f"{what} is not fetched automatically; {get_it}")
    root = Path(data_path).expanduser()
    if not root.is_dir():
        raise DataError(f"{what} path {root} is not a directory; {get_it}")
    found = {}
    for key, name in names.items():
        matches = sorted(root.rglob(name))
        if not matches:
            raise DataError(f"no {name} under {root}; {get_it}")
        found[key] = matches[0]
    return found
