"""The byte codec of byte-level models: text <-> UTF-8 byte token ids 0..255.

Byte-level corpora (enwik8, Shakespeare, plain text, ImageNet64's subpixels) use it as their
tokenizer, and a 256-token model is sampled with it without its corpus at hand.
"""

from __future__ import annotations

from typing import Sequence

BYTE_VOCAB = 256


def encode_bytes(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes. Bytes that were not UTF-8 where the text came from (a command line's,
    which Python holds as the surrogates U+DC80..U+DCFF) are those bytes again: a byte model reads any byte."""
    return list(text.encode("utf-8", errors="surrogateescape"))


def decode_bytes(ids: Sequence[int]) -> str:
    """Text of byte token ids; invalid UTF-8 (e.g. a character cut in half) becomes U+FFFD."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
