"""What a data file's first bytes say it is, so that byte-level loaders never train on a compressed stream.

A byte-level corpus is the file's bytes as they are. A ``.gz``, ``.bz2``, ``.xz``, ``.zst`` or ``.zip`` given as
text would still train (its bytes are valid input), at about 8 bits per byte and with no warning: the mistake shows
only in the loss. So the loaders ask here first: :func:`container_of` names the format the magic number shows,
:func:`refuse_container` turns one into a :class:`~transformer_vq.data.errors.DataError` naming the file, and
:func:`gunzip` decompresses a file that must be gzip (dictzip is gzip) and refuses one whose name says gzip while
its bytes do not (a damaged header, or another compressor under a ``.dz`` name).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from transformer_vq.data.errors import DataError

# Magic numbers of the compressors and archives a user is likely to hand over by mistake, with the command that
# unpacks each (so the refusal can say what to run).
MAGICS: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip", "gunzip -k"),
    (b"BZh", "bzip2", "bunzip2 -k"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"PK\x05\x06", "zip", "unzip"),
    (b"7z\xbc\xaf\x27\x1c", "7z", "7z x"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)
GZIP_SUFFIXES = (".gz", ".dz", ".tgz")
HEAD = 8  # bytes read to sniff: the longest magic above


def container_of(head: bytes) -> tuple[str, str] | None:
    """``(format, unpack command)`` when ``head`` (a file's first bytes) starts with a known magic, else ``None``."""
    for magic, name, command in MAGICS:
        if head.startswith(magic):
            return name, command
    return None


def refuse_container(path: Path, remedy: str) -> None:
    """Raise :class:`DataError` when the file at ``path`` is compressed or an archive (by its bytes, not its name).

    ``remedy`` ends the message (what else the user can pass).
    """
    with open(path, "rb") as handle:
        found = container_of(handle.read(HEAD))
    if found is not None:
        name, command = found
        raise DataError(f"{path} is {name}-compressed data, not text (its bytes would be trained on as they are); "
                        f"unpack it first ({command} {path.name}) and pass the result, or {remedy}")


def gunzip(raw: bytes, source: Path | str, remedy: str) -> bytes:
    """The bytes of ``raw`` (the contents of ``source``), gunzipped when gzip's; a gzip name must hold gzip bytes.

    Raises :class:`DataError` (ending with ``remedy``) for a corrupt stream, for a ``.gz``/``.dz`` name whose bytes
    are not gzip (a damaged header or another compressor), and for another compressor's bytes under any name.
    """
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"cannot decompress {source} ({exc}); it is corrupt: fetch it again or {remedy}") from exc
    found = container_of(raw[:HEAD])
    if found is not None:
        raise DataError(f"{source} is {found[0]}-compressed, not gzip nor plain; unpack it ({found[1]}) and pass "
                        f"the result, or {remedy}")
    if str(source).endswith(GZIP_SUFFIXES):
        raise DataError(f"{source} is named as gzip but does not start with gzip's magic number (it starts with "
                        f"{raw[:4].hex() or 'nothing'}); it is corrupt: fetch it again or {remedy}")
    return raw
