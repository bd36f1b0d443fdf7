"""A SentencePiece BPE tokenizer whose encode/decode round-trips any text exactly.

SentencePiece's defaults are lossy: NFKC normalization rewrites characters, runs of spaces are
collapsed, a dummy space is prefixed. :data:`TRAINER_OPTIONS` turns all of that off
(``identity`` normalization, no whitespace collapsing, no dummy prefix) and enables byte
fallback, so characters outside the vocabulary become their UTF-8 bytes instead of ``<unk>``.
Newlines get their own piece; digits are split one per piece (a common choice for numbers).

One character still does not survive SentencePiece alone: U+2581 (``▁``), the symbol it uses
internally for a space, which decodes back to a space. :meth:`ExactTokenizer.encode` therefore
cuts the text at every ``▁`` and emits that character as its three UTF-8 byte pieces, which
decode to ``▁`` itself. With that, ``decode(encode(text)) == text`` for every Python string that
can be encoded as UTF-8 (lone surrogates cannot be, and are rejected).

Id 0 is ``<unk>`` (never produced, thanks to byte fallback), id 1 is ``</s>``, used as the
end-of-document token; there is no BOS or padding id.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from transformer_vq import fileio
from transformer_vq.data.errors import DataError

SPACE_SYMBOL = "\u2581"
EOD_ID = 1

TRAINER_OPTIONS = dict(
    model_type="bpe",
    normalization_rule_name="identity",  # no NFKC: text comes back byte for byte
    remove_extra_whitespaces=False,  # keep runs of spaces, leading and trailing spaces
    add_dummy_prefix=False,  # no invented leading space
    byte_fallback=True,  # unknown characters become byte pieces, never <unk>
    character_coverage=1.0,
    split_digits=True,
    allow_whitespace_only_pieces=True,  # indentation and blank runs compress well
    user_defined_symbols=["\n"],  # newline as a piece of its own (training sees single lines)
    unk_id=0,
    eos_id=EOD_ID,
    bos_id=-1,
    pad_id=-1,
    # a text too small for the size asked is refused (see train_tokenizer), never given fewer pieces in silence: the
    # size names the file, selects it (vocab_size=N) and must equal the model's --vocab-size
    hard_vocab_limit=True,
    max_sentence_length=1 << 16,
    shuffle_input_sentence=True,
)


def _processor(model_proto: bytes):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=model_proto)


class ExactTokenizer:
    """A trained SentencePiece model with exact-round-trip encode/decode.

    Args:
        model_proto: the serialized model (the contents of a ``.model`` file).
        path: where it was loaded from, if anywhere (for messages and metadata).
    """

    def __init__(self, model_proto: bytes, path: str | os.PathLike | None = None):
        self.model_proto = bytes(model_proto)
        self.path = Path(path) if path is not None else None
        self.sp = _processor(self.model_proto)
        self.vocab_size = int(self.sp.get_piece_size())
        if self.vocab_size == 0:  # sentencepiece accepts an empty proto, and fails at the first encode
            raise DataError(f"{self.path or 'the tokenizer given'} holds no SentencePiece model (it is empty); "
                            f"retrain it with `tvq tokenizer`")
        self.eod_id = int(self.sp.eos_id())
        self._space_symbol_ids = [self.sp.piece_to_id(f"<0x{b:02X}>") for b in SPACE_SYMBOL.encode("utf-8")]
        # dtype of stored token arrays: two bytes per token whenever the vocabulary fits
        self.dtype = np.uint16 if self.vocab_size <= 1 << 16 else np.int32

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ExactTokenizer":
        """Load a ``.model`` file written by :func:`train_tokenizer`."""
        path = Path(path).expanduser()
        try:
            return cls(path.read_bytes(), path)
        except OSError as exc:
            raise DataError(f"cannot read tokenizer {path} ({exc.strerror or exc}); check the path or retrain it "
                            "with `tvq tokenizer`") from exc
        except RuntimeError as exc:  # sentencepiece's error for a file that is not a model
            raise DataError(f"{path} is not a SentencePiece model ({exc}); retrain it with `tvq tokenizer`") from exc

    @property
    def sha256(self) -> str:
        """SHA-256 of the serialized model (identifies the tokenizer in run metadata)."""
        import hashlib

        return hashlib.sha256(self.model_proto).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; ``decode`` of them returns ``text`` exactly."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
        """:meth:`encode` of several texts, with SentencePiece's threads (``0``: its default)."""
        pieces = [text.split(SPACE_SYMBOL) for text in texts]
        flat = [part for parts in pieces for part in parts]
        try:
            encoded = self.sp.encode(flat, num_threads=num_threads) if flat else []
        except (UnicodeEncodeError, TypeError) as exc:
            raise DataError(f"text cannot be tokenized ({exc}): it must be valid Unicode without lone "
                            "surrogates") from exc
        out, k = [], 0
        for parts in pieces:
            ids = []
            for j in range(len(parts)):
                if j:
                    ids.extend(self._space_symbol_ids)
                ids.extend(encoded[k])
                k += 1
            out.append(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids; end-of-document tokens decode to nothing."""
        return self.sp.decode([int(i) for i in ids])


# SentencePiece's refusal of a vocabulary the text cannot reach (hard_vocab_limit): "... Vocabulary size too high
# (100000). Please set it to a value <= 330."
TOO_HIGH = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")


class _Counted:
    """An iterator over the lines of training text that counts those read (SentencePiece reads them all, sampling
    ``max_sentences`` of them as it goes)."""

    def __init__(self, lines: Iterable[str]):
        self.lines, self.count = iter(lines), 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.count += 1
        return line


def too_large_message(vocab_size: int, reached: int, lines: int, max_sentences: int) -> str:
    """Why ``vocab_size`` pieces cannot be trained from ``lines`` lines that support ``reached``."""
    if lines > max_sentences:
        source = f"the {max_sentences:,} lines sampled (--max-sentences) of its {lines:,}"
        remedy = "raise --max-sentences"
    else:
        source, remedy = f"its {lines:,} lines", "train on more text"
    return (f"--vocab-size {vocab_size} is more than the training text supports: SentencePiece can form at most "
            f"{reached} pieces from {source}; pass --vocab-size {reached} or less, or {remedy} (nothing was saved)")


def train_tokenizer(
    lines: Iterable[str],
    out: str | os.PathLike,
    *,
    vocab_size: int = 32000,
    max_sentences: int = 10_000_000,
    num_threads: int | None = None,
    seed: int = 0,
    **facts,
) -> ExactTokenizer:
    """Train an exact-round-trip BPE model on ``lines`` and save it atomically at ``out``.

    Args:
        lines: training text, one line per item (without the newline).
        out: the ``.model`` file to write; a manifest ``out.json`` records its checksum, the
            settings and ``facts``.
        vocab_size: number of pieces (32,000 in the paper); exactly that many, or :class:`DataError` when the
            text cannot form that many (naming the most it can), never fewer.
        max_sentences: at most this many lines are sampled for training (bounds memory).
        num_threads: trainer threads (default: all CPUs).
        seed: SentencePiece's random seed, for reproducible sampling.
    """
    import sentencepiece as spm

    if vocab_size < 300:
        raise DataError(f"vocab_size={vocab_size} is too small: the 256 byte pieces alone need room; use at least 300")
    if max_sentences <= 100:  # SentencePiece's own refusal names neither the option nor the bound
        raise DataError(f"max_sentences={max_sentences} is too small: SentencePiece samples more than 100 lines")
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    lines = _Counted(lines)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_writer=model,
            vocab_size=vocab_size,
            input_sentence_size=max_sentences,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,
            **TRAINER_OPTIONS,
        )
    except RuntimeError as exc:
        reached = TOO_HIGH.search(str(exc))
        if reached:
            raise DataError(too_large_message(vocab_size, int(reached.group(1)), lines.count, max_sentences)) from exc
        raise DataError(f"SentencePiece training failed ({exc}). Use a larger --vocab-size (it must cover the 256 "
                        f"byte pieces plus every distinct character), and check the training text is not "
                        "empty") from exc
    out = Path(out)
    fileio.atomic_write_bytes(out, model.getvalue())
    tokenizer = ExactTokenizer(model.getvalue(), out)
    fileio.write_manifest(out, vocab_size=tokenizer.vocab_size, requested_vocab_size=vocab_size,
                         max_sentences=max_sentences, seed=seed, **facts)
    return tokenizer
