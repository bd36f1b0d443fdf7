"""``text``: any local text file, or a directory of them, as a byte-level corpus.

A single file is memory-mapped in place (nothing copied). A directory's files -- every regular,
non-hidden file below it, in sorted relative-path order, or only those matching ``glob`` -- are
concatenated once into the cache; each file is a document (see ``Corpus.documents``). The cached
copy is keyed by the files' names, sizes and modification times, so editing a file rebuilds it.
The split is the fixed contiguous 90/5/5 of :mod:`transformer_vq.data.splits`. A single file is one document, or,
with ``lines=True``, one document per line (a text-lines file of records, for ``tvq train --pack``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.formats import refuse_container
from transformer_vq.data.options import Fractions
from transformer_vq.data.progress import Advance, building, no_progress
from transformer_vq.data.splits import DEFAULT_FRACTIONS, byte_corpus


def list_text_files(directory: Path, glob: str | None = None) -> list[Path]:
    """The files of ``directory`` a text corpus is built from, in a deterministic order.

    Recursively every regular file whose path has no component starting with ``.`` (so ``.git``
    and editor backups are skipped), or only those matching ``glob`` (e.g. ``"*.txt"``), sorted by
    path relative to ``directory``.
    """
    pattern = glob or "*"
    files = []
    for path in directory.rglob(pattern):
        rel = path.relative_to(directory)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(directory).as_posix())


def line_starts(path: Path) -> np.ndarray:
    """Byte offsets where the lines of file ``path`` begin (0, then one past every newline but a final one)."""
    data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint8)
    after_newline = np.flatnonzero(data == ord("\n")) + 1
    return np.concatenate([[0], after_newline[after_newline < len(data)]]).astype(np.int64)


def concatenate_files(files: Sequence[Path], out: Path, advance: Advance = no_progress, **facts) -> dict:
    """Concatenate ``files`` into ``out`` atomically (``advance`` counts them) and write its manifest.

    The manifest records each file's relative name and the byte offset where it starts (the
    document boundaries) besides the size and SHA-256 of ``out``. Returns the manifest.
    """
    starts = []
    offset = 0
    with fileio.atomic_writer(out) as sink:
        for path in files:
            starts.append(offset)
            with open(path, "rb") as source:
                while chunk := source.read(fileio.CHUNK):
                    sink.write(chunk)
                    offset += len(chunk)
            advance(1)
    return fileio.write_manifest(out, doc_starts=starts, **facts)


def load_text(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    glob: str | None = None,
    fractions: Fractions = DEFAULT_FRACTIONS,
    lines: bool = False,
) -> Corpus:
    """Load a local text file or directory as a byte-level corpus named ``"text"``.

    Args:
        data_path: a file, or a directory whose files are concatenated (see :func:`list_text_files`).
        cache_dir: cache root for the concatenation of a directory (default: the user cache).
        glob: only use directory files matching this pattern, e.g. ``"*.txt"``.
        fractions: train/validation/test fractions of the contiguous split.
        lines: a single file's lines are its documents (each ends with its newline).
    """
    if data_path is None:
        raise DataError("--data text needs a file or directory: pass --data-path FILE_OR_DIR")
    path = Path(data_path).expanduser()
    if not path.exists():
        raise DataError(f"data path {path} does not exist; pass --data-path with an existing text file or directory")
    if path.is_file():
        if glob is not None:
            raise DataError(f"glob={glob!r} only applies to a directory, but {path} is a file; drop the glob option")
        refuse_container(path, "pass a text file or directory with --data-path")
        starts = line_starts(path) if lines else [0]
        return byte_corpus("text", path, fractions=fractions, doc_starts=starts, metadata={"source": str(path)})
    if lines:
        raise DataError(f"lines=True splits a single file into documents, but {path} is a directory (one document "
                        "per file already); drop the lines option")
    if not path.is_dir():
        raise DataError(f"data path {path} is neither a regular file nor a directory; pass a text file or directory")

    files = list_text_files(path, glob)
    if not files:
        what = f"files matching {glob!r}" if glob else "non-hidden files"
        raise DataError(f"directory {path} contains no {what}; put text files in it or pass a text file with "
                        "--data-path")
    for file in files:  # eight bytes each, on every load: a cached concatenation may predate the check
        refuse_container(file, f"move it out of {path}, or choose the text files with --data-option glob=PATTERN")
    # Key the cached concatenation by what was concatenated, so any change gives a fresh copy.
    out = cache.dataset_dir("text", cache_dir) / f"{cache.fingerprint(files, root=str(path.resolve()))}.bin"
    manifest = fileio.verified_manifest(out)
    if manifest is None:
        names = [f.relative_to(path).as_posix() for f in files]
        with building(f"text of {path}", out, len(files), "file") as advance:
            manifest = concatenate_files(files, out, advance, source=str(path.resolve()), names=names)
    return byte_corpus(
        "text",
        out,
        fractions=fractions,
        doc_starts=manifest["doc_starts"],
        metadata={"source": str(path.resolve()), "files": len(files), "sha256": manifest["sha256"]},
    )
