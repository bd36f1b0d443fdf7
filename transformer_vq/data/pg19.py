"""``pg19``: Project Gutenberg books before 1919 (Rae et al., 2020), SentencePiece-tokenized.

Layout of the release (``gs://deepmind-gutenberg``, also mirrored elsewhere)::

    ROOT/train/*.txt   ROOT/validation/*.txt   ROOT/test/*.txt   (one book per file, UTF-8)

A BPE tokenizer (32,000 pieces in the paper) is trained on the training books by
``tvq tokenizer --data-path ROOT`` (:func:`train_pg19_tokenizer`) and stored in the cache under a
name derived from the training files, where :func:`load_pg19` finds it; ``tokenizer=PATH``
selects another one. Each split is tokenized once, book by book in sorted file-name order, each
book followed by the end-of-document id, into a ``.npy`` file in the cache that is then
memory-mapped. ``split_bytes`` are the books' original UTF-8 byte counts (so bits per byte is over
the original text) and ``metadata["split_words"]`` their whitespace-separated word counts (for
word-level perplexity as in Rae et al.).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Iterator

import numpy as np

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import Rules
from transformer_vq.data.metrics import count_words
from transformer_vq.data.progress import Advance, building, no_progress
from transformer_vq.data.splits import SPLITS
from transformer_vq.data.tokenizer import ExactTokenizer, train_tokenizer

DEFAULT_VOCAB_SIZE = 32000
GET_IT = "PG-19 is at https://github.com/google-deepmind/pg19 (gs://deepmind-gutenberg)"
# Books are tokenized this many at a time, in parallel inside SentencePiece.
BOOKS_PER_BATCH = 32


def split_files(root: str | os.PathLike, split: str) -> list[Path]:
    """The ``.txt`` books of one split of the PG-19 tree at ``root``, sorted by file name."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"PG-19 root {root} is not a directory; pass --data-path with the directory holding train/, "
                        f"validation/ and test/. {GET_IT}")
    directory = root / split
    if not directory.is_dir():
        raise DataError(f"PG-19 root {root} has no {split}/ directory (expected train/, validation/ and test/ of "
                        f".txt books). {GET_IT}")
    files = sorted(p for p in directory.glob("*.txt") if p.is_file())
    if not files:
        raise DataError(f"{directory} contains no .txt books; PG-19 splits are directories of one .txt file per "
                        f"book. {GET_IT}")
    return files


def read_book(path: Path) -> str:
    """A book's text, decoded as strict UTF-8 (raw bytes are what ``split_bytes`` counts)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not valid UTF-8 ({exc}); PG-19 books are UTF-8: re-download the file") from exc


def training_lines(files: list[Path]) -> Iterator[str]:
    """Every line of every book in ``files`` (SentencePiece trains on lines)."""
    for path in files:
        yield from read_book(path).split("\n")


def default_tokenizer_path(data_path: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``tvq tokenizer`` saves, and :func:`load_pg19` looks for, the tokenizer of a PG-19 tree."""
    key = cache.fingerprint(split_files(data_path, "train"))
    return cache.dataset_dir("pg19", cache_dir) / f"tokenizer-{vocab_size}-{key}.model"


def find_tokenizer(data_path: str | os.PathLike, vocab_size: int | None = None,
                   cache_dir: str | os.PathLike | None = None) -> Path:
    """The tokenizer ``tvq tokenizer`` saved for the PG-19 tree at ``data_path``.

    With ``vocab_size`` given, that one; otherwise the 32,000-piece one when it exists, else the
    only one trained for this tree. Raises :class:`DataError` when absent, saying where it looked, how to use one
    saved elsewhere (``--data-option tokenizer=PATH``) and how to train it.
    """
    wanted = default_tokenizer_path(data_path, vocab_size or DEFAULT_VOCAB_SIZE, cache_dir)
    if wanted.is_file():
        return wanted
    key = wanted.name.rsplit("-", 1)[-1]  # "<key>.model": the same for every vocabulary size
    trained = sorted(wanted.parent.glob(f"tokenizer-*-{key}"))
    if vocab_size is None and len(trained) == 1:
        return trained[0]
    sizes = ", ".join(p.name.split("-")[1] for p in trained)
    size = vocab_size or DEFAULT_VOCAB_SIZE
    found = f" (trained here: {sizes}; choose one with --data-option vocab_size=N)" if trained else ""
    raise DataError(
        f"no {size}-piece tokenizer has been trained for {data_path} yet{found}: none is in {wanted.parent}, where "
        f"`tvq tokenizer --data-path {data_path}` saves it. Use one saved elsewhere (`tvq tokenizer --out` or "
        f"--cache-dir) with --data-option tokenizer=PATH (Python: load_corpus('pg19', ..., tokenizer=PATH)), or "
        f"train it: `tvq tokenizer --data-path {data_path} --vocab-size {size}`"
    )


def check_new_file(out: Path) -> None:
    """Refuse an ``--out`` that exists: nothing is overwritten (as ``tvq export`` refuses an ``--out`` with files)."""
    if out.is_dir():
        raise DataError(f"--out: {out} is a directory; pass the path of the .model file to write")
    if out.exists():
        raise DataError(f"--out: {out} exists already; pass a new path, or remove it first (nothing is overwritten)")


def train_pg19_tokenizer(
    data_path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_sentences: int = 10_000_000,
    cache_dir: str | os.PathLike | None = None,
    num_threads: int | None = None,
) -> ExactTokenizer:
    """Train the PG-19 BPE tokenizer on the training books; saved at ``out`` or the default path (the cache, where
    :func:`load_pg19` finds it). An ``out`` that exists is refused: nothing there is ever overwritten."""
    files = split_files(data_path, "train")
    if out is not None:
        check_new_file(Path(out))
    out = Path(out) if out is not None else default_tokenizer_path(data_path, vocab_size, cache_dir)
    return train_tokenizer(
        training_lines(files), out, vocab_size=vocab_size, max_sentences=max_sentences,
        num_threads=num_threads, source=str(Path(data_path).resolve()), train_books=len(files),
    )


def tokenize_split(files: list[Path], tokenizer: ExactTokenizer, out: Path, advance: Advance = no_progress) -> dict:
    """Tokenize books into ``out`` (``.npy``), each followed by EOD (``advance`` counts the books); returns the
    written manifest.

    Tokens stream to an unnamed scratch file, then are copied after the ``.npy`` header (which needs the final
    length), so memory stays at one batch of books. Nothing here has a fixed temporary name: processes that build the
    same split at once (the workers of a first ``torchrun`` on a fresh cache) each write their own files and publish
    them by an atomic rename, so each gets a whole split. Document starts go to ``out`` with suffix ``.docs.npy``;
    byte and word counts to the manifest.
    """
    dtype = np.dtype(tokenizer.dtype)
    starts, n_tokens, n_bytes, n_words = [], 0, 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    # unlinked at once by the system: gone with this process, whatever ends it
    with tempfile.TemporaryFile(dir=out.parent) as scratch:
        for i in range(0, len(files), BOOKS_PER_BATCH):
            batch = files[i:i + BOOKS_PER_BATCH]
            texts = [read_book(path) for path in batch]
            for path, text, ids in zip(batch, texts, tokenizer.encode_batch(texts)):
                starts.append(n_tokens)
                ids.append(tokenizer.eod_id)
                scratch.write(np.asarray(ids, dtype=dtype).tobytes())
                n_tokens += len(ids)
                n_bytes += path.stat().st_size
                n_words += count_words(text)
            advance(len(batch))
        scratch.seek(0)
        with fileio.atomic_writer(out) as handle:
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n_tokens,)}
            np.lib.format.write_array_header_1_0(handle, header)
            shutil.copyfileobj(scratch, handle, fileio.CHUNK * dtype.itemsize)
    with fileio.atomic_writer(out.with_name(out.stem + ".docs.npy")) as handle:
        np.save(handle, np.asarray(starts, dtype=np.int64))
    return fileio.write_manifest(out, tokens=n_tokens, bytes=n_bytes, words=n_words, books=len(files),
                               tokenizer_sha256=tokenizer.sha256)


def load_pg19(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    vocab_size: Annotated[int, Rules(min=2)] | None = None,
) -> Corpus:
    """Load PG-19 tokenized with its SentencePiece model, tokenizing each split once into the cache.

    Args:
        data_path: the PG-19 root (``train/``, ``validation/``, ``test/`` of ``.txt`` books).
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        tokenizer: a ``.model`` file; default: the one ``tvq tokenizer`` saved for this tree.
        vocab_size: which saved tokenizer to use (ignored when ``tokenizer`` is given); default:
            the 32,000-piece one, or the only one trained for this tree.
    """
    if data_path is None:
        raise DataError(f"--data pg19 needs the dataset: pass --data-path PG19_ROOT (with train/, validation/, "
                        f"test/). {GET_IT}")
    files = {split: split_files(data_path, split) for split in SPLITS}
    tokenizer_path = (Path(tokenizer).expanduser() if tokenizer is not None
                      else find_tokenizer(data_path, vocab_size, cache_dir))
    sp = ExactTokenizer.load(tokenizer_path)

    splits, documents, split_bytes, split_words = {}, {}, {}, {}
    for split, books in files.items():
        key = cache.fingerprint(books, tokenizer_sha256=sp.sha256)
        out = cache.dataset_dir("pg19", cache_dir) / key / f"{split}.npy"
        # Tokenized splits are derived data: check the size only (hashing gigabytes on every
        # load costs more than the rare rebuild); a mismatch rebuilds the split.
        manifest = fileio.verified_manifest(out, full=False)
        docs_path = out.with_name(out.stem + ".docs.npy")
        if manifest is None or not docs_path.is_file():
            with building(f"pg19 {split} split", out, len(books), "book") as advance:
                manifest = tokenize_split(books, sp, out, advance)
        splits[split] = np.load(out, mmap_mode="r")
        documents[split] = np.load(docs_path)
        split_bytes[split] = int(manifest["bytes"])
        split_words[split] = int(manifest["words"])
    return Corpus(
        name="pg19",
        splits=splits,
        vocab_size=sp.vocab_size,
        split_bytes=split_bytes,
        encode=sp.encode,
        decode=sp.decode,
        eod_id=sp.eod_id,
        documents=documents,
        metadata={
            "source": str(Path(data_path).resolve()),
            "tokenizer": str(tokenizer_path.resolve()),
            "tokenizer_sha256": sp.sha256,
            "split_words": split_words,
            "split_books": {split: len(books) for split, books in files.items()},
            "tokenization": f"sentencepiece-bpe-{sp.vocab_size}",
        },
    )
