"""Evaluation metrics from the mean next-token negative log-likelihood, as the paper reports them;
evaluation and the training log both compute them here.

* Bits per byte (enwik8, the byte-level corpora, and ImageNet64 where a byte is a subpixel):
  total NLL in bits over the number of *original* bytes, i.e. the mean NLL in bits times the
  split's tokens per byte. For tokenized text (PG-19) the NLL of all tokens, end-of-document
  tokens included, is divided by the UTF-8 byte count of the original text, so the number is
  comparable across tokenizers.
* Word-level perplexity (PG-19, following Rae et al., 2020): ``exp(total NLL in nats / number of
  words)``, where words are the whitespace-separated words of the original text (Python's
  ``str.split()`` with no argument, :func:`count_words`).

Evaluation sums per-token losses in double precision before taking the mean, so millions of them
lose nothing that matters at the reported precision.
"""

from __future__ import annotations

import math

import numpy as np

LN2 = math.log(2.0)

# exp() of more than this overflows a float: an untrained model over a large vocabulary gets inf
_MAX_EXP = 709.0


def bits_per_byte(mean_nll: float, tokens_per_byte: float = 1.0) -> float:
    """Bits per original byte from the mean next-token NLL in nats: ``mean_nll / ln 2 * tokens_per_byte``
    (total NLL in bits over the original bytes). ``tokens_per_byte`` is 1 for byte-level data, where
    uniform logits over 256 bytes (``ln 256`` nats per token) give exactly 8.0."""
    return mean_nll / LN2 * tokens_per_byte


def bpb_unit(objective: str) -> str:
    """What a bits-per-byte figure counts: 'bits per byte' for next-token prediction, 'bits per masked byte' for an
    encoder's masked tokens (``objective`` 'masked-token')."""
    return "bits per masked byte" if objective == "masked-token" else "bits per byte"


def word_perplexity(mean_nll: float, tokens_per_word: float) -> float:
    """Word-level perplexity (Rae et al., 2020) from the mean next-token NLL in nats:
    ``exp(total NLL / words) = exp(mean_nll * tokens_per_word)``, inf when that overflows."""
    exponent = mean_nll * tokens_per_word
    return math.exp(exponent) if exponent < _MAX_EXP else math.inf


def corpus_tokens_per_byte(corpus, split: str) -> float:
    """Tokens per original byte of ``split`` of a :class:`~transformer_vq.data.corpus.Corpus`."""
    n_bytes = corpus.split_bytes.get(split) or len(corpus.split(split))
    return len(corpus.split(split)) / n_bytes


def corpus_tokens_per_word(corpus, split: str) -> float | None:
    """Tokens per whitespace-separated word of the original text of ``split``, for corpora that count
    words (``metadata["split_words"]``, e.g. PG-19, with :func:`count_words`); None otherwise."""
    words = (corpus.metadata.get("split_words") or {}).get(split)
    return len(corpus.split(split)) / words if words else None


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
