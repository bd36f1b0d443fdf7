"""The byte codec of byte-level models: text <-> UTF-8 byte token ids 0..255.

Byte-level corpora (enwik8, Shakespeare, plain text, ImageNet64's subpixels) use it as their
tokenizer, and a 256-token model is sampled with it without its corpus at hand.
"""

from __future__ import annotations

from typing import Sequence

BYTE_VOCAB = 256


def encode_bytes(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode_bytes(ids: Sequence[int]) -> str:
    """Text of byte token ids; invalid UTF-8 (e.g. a character cut in half) becomes U+FFFD."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
