"""The reading boundary: every file a user names (a config file, a run's config.json, exported weights) is read
through these functions, and anything wrong with it (missing, a directory, binary where text was expected, not
valid JSON, a pickle or garbage under a safetensors name) is an :class:`UnreadableFile` that names the path, what
was expected and what to do, never a decoder's or a library's traceback.

Placed in the configuration package, the bottom layer every other one may import (config files are read here too);
torch and safetensors are imported only by the functions that read weights, so ``tvq --help`` stays fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformer_vq.config.fields import one_line

PICKLE_MAGIC = (b"\x80", b"PK\x03\x04")
"""How a ``torch.save`` file starts: a pickle protocol byte, or the zip archive of the newer format."""


class UnreadableFile(ValueError):
    """A file that is not what its reader expects; the message names it, what was expected and what to do."""


def _file(path: str | os.PathLike, what: str, hint: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UnreadableFile(f"{path} is a directory, not {what}; {hint}")
    if not path.is_file():
        raise UnreadableFile(f"{path} does not exist or is not a regular file ({what} was expected); {hint}")
    return path


def read_bytes(path: str | os.PathLike, what: str, hint: str, limit: int = -1) -> bytes:
    """The bytes of ``path`` (the first ``limit`` of them, when given), which should be ``what`` ("a YAML run
    config"); ``hint`` says what to do otherwise."""
    path = _file(path, what, hint)
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError as err:
        raise UnreadableFile(f"cannot read {what} {path}: {err.strerror or err}; {hint}") from None


def read_text(path: str | os.PathLike, what: str, hint: str) -> str:
    """The UTF-8 text of ``path``; a binary file is refused with the offset of its first undecodable byte."""
    data = read_bytes(path, what, hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"{path} is not {what}: it is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                             f"{err.start}; a binary file?); {hint}") from None


def read_json(path: str | os.PathLike, what: str, hint: str):
    """The JSON value held by ``path``."""
    text = read_text(path, what, hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UnreadableFile(f"{path} is not {what}: invalid JSON at line {err.lineno}, column {err.colno} "
                             f"({err.msg}); {hint}") from None


def check_safetensors(path: str | os.PathLike, what: str, hint: str) -> Path:
    """``path``, once its header reads as a safetensors file (a pickle or garbage under the name is refused, saying
    which); the tensors are then read by whoever loads them."""
    from safetensors import safe_open

    head = read_bytes(path, what, hint, limit=9)
    path = Path(path)
    # A safetensors file opens with its header's length (8 bytes, little-endian) and then the header's "{"; that
    # length may itself start with 0x80 (a header of 128 + 256 n bytes), so the magic alone does not make a pickle.
    if head.startswith(PICKLE_MAGIC) and head[8:9] != b"{":
        raise UnreadableFile(f"{path} is not {what}: it is a PyTorch pickle (torch.save), not a safetensors file; "
                             f"{hint}")
    try:
        with safe_open(str(path), framework="pt") as reader:
            reader.keys()
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for every malformed file
        detail = one_line(str(err)) or type(err).__name__
        raise UnreadableFile(f"{path} is not {what}: not a valid safetensors file ({detail}); {hint}") from None
    return path
