"""Evaluation metrics from a total negative log-likelihood, as the paper reports them.

* Bits per byte (enwik8, the byte-level corpora, and ImageNet64 where a byte is a subpixel):
  total NLL in bits over the number of *original* bytes. For tokenized text (PG-19) the NLL of
  all tokens, end-of-document tokens included, is divided by the UTF-8 byte count of the original
  text, so the number is comparable across tokenizers.
* Word-level perplexity (PG-19, following Rae et al., 2020): ``exp(total NLL in nats / number of
  words)``, where words are the whitespace-separated words of the original text (Python's
  ``str.split()`` with no argument).

Totals are taken as Python floats (double precision) so summing millions of per-token losses
loses nothing that matters at the reported precision.
"""

from __future__ import annotations

import math

import numpy as np

LN2 = math.log(2.0)


def bits_per_byte(total_nll_nats: float, num_bytes: int) -> float:
    """Bits per byte: ``total_nll_nats / (num_bytes * ln 2)``.

    Uniform logits over 256 byte values give ``ln 256`` nats per byte, i.e. exactly 8.0.
    """
    if num_bytes <= 0:
        raise ValueError(f"num_bytes must be positive, got {num_bytes}")
    return float(total_nll_nats) / (num_bytes * LN2)


def bits_per_token(total_nll_nats: float, num_tokens: int) -> float:
    """Mean NLL per token in bits (equal to bits per byte for byte-level data)."""
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be positive, got {num_tokens}")
    return float(total_nll_nats) / (num_tokens * LN2)


def word_level_perplexity(total_nll_nats: float, num_words: int) -> float:
    """Word-level perplexity as in Rae et al. (2020): ``exp(total_nll_nats / num_words)``."""
    if num_words <= 0:
        raise ValueError(f"num_words must be positive, got {num_words}")
    return math.exp(float(total_nll_nats) / num_words)


def count_words(text: str | bytes | np.ndarray) -> int:
    """Number of whitespace-separated words of ``text``.

    ``str``: ``len(text.split())``. ``bytes`` or a ``uint8`` array (e.g. a memory-mapped byte
    split): the same count over ASCII whitespace (space, \\t, \\n, \\v, \\f, \\r, and the
    separators \\x1c-\\x1f that ``str.split`` also uses), computed in chunks without decoding,
    so it is exact for ASCII text and treats multi-byte characters as word characters.
    """
    if isinstance(text, str):
        return len(text.split())
    data = np.frombuffer(text, dtype=np.uint8) if isinstance(text, (bytes, bytearray, memoryview)) else np.asarray(text)
    space = np.zeros(256, dtype=bool)
    space[[0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F]] = True
    words, previous_space, step = 0, True, 1 << 24
    for begin in range(0, len(data), step):
        is_space = space[np.asarray(data[begin:begin + step], dtype=np.uint8)]
        # A word starts at every non-space byte preceded by a space (or the start of the text).
        preceded = np.concatenate([[previous_space], is_space[:-1]])
        words += int(np.count_nonzero(~is_space & preceded))
        previous_space = bool(is_space[-1]) if len(is_space) else previous_space
    return words
