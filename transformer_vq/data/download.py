"""Fetching a file from a URL into the cache, streamed and atomic.

Only the standard library is used (``urllib``), so ``http(s)://`` and ``file://`` URLs both work;
the latter lets tests exercise the download path without a network.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.data.errors import DataError


def download(url: str, dest: str | os.PathLike, *, timeout: float = 60.0, hint: str = "") -> Path:
    """Download ``url`` to ``dest`` atomically (nothing appears at ``dest`` unless complete).

    Raises :class:`DataError` naming the URL, the reason and ``hint`` (what to do instead) on
    any network or HTTP failure, or when fewer bytes arrive than the server announced.
    """
    dest = Path(dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            announced = response.headers.get("Content-Length")
            received = 0
            with fileio.atomic_writer(dest) as sink:
                while chunk := response.read(fileio.CHUNK):
                    sink.write(chunk)
                    received += len(chunk)
                if announced is not None and received != int(announced):
                    raise DataError(
                        f"download of {url} stopped after {received:,} of {int(announced):,} bytes. "
                        f"Run again to retry. {hint}".strip()
                    )
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"could not download {url} ({reason}). Check your network. {hint}".strip()) from exc
    return dest
