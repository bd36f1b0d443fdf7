"""``listops``: generated with LRA's specification, or read from LRA's released TSV files.

Without ``data_path`` the three splits are generated (:mod:`transformer_vq.data.classify.listops`)
with LRA's sizes (96,000 / 2,000 / 2,000) and limits unless options say otherwise, once, into the
cache. With ``data_path`` (the release's ``listops-1000`` directory, or any directory holding the
files) the splits are ``basic_train.tsv``, ``basic_val.tsv`` and ``basic_test.tsv``: a header line
``Source<TAB>Target``, then one expression and its value per line. They are parsed line by line
into the cache once and memory-mapped afterwards; a line whose expression is malformed (unbalanced
brackets) or whose label is not its value is refused with its file and line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import numpy as np

from transformer_vq.config.choices import SPLITS
from transformer_vq.data.classify import listops
from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.classify.release import find_release_files
from transformer_vq.data.classify.store import ExamplesWriter, cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import WITHOUT_PATH, NonNegative, Positive, Rules
from transformer_vq.data.progress import Advance, no_progress

RELEASE_FILES = {"train": "basic_train.tsv", "validation": "basic_val.tsv", "test": "basic_test.tsv"}
HEADER = "Source\tTarget"
GET_IT = ("pass --data-path with the directory of LRA's listops-1000 release (basic_train.tsv, basic_val.tsv, "
          "basic_test.tsv), or leave --data-path out to generate ListOps")


def read_tsv(path: Path, scratch: Path, advance: Advance = no_progress) -> Examples:
    """The expressions and labels of one released TSV file, streamed through a token file at
    ``scratch`` (``DataError`` naming file and line; ``advance`` counts the lines)."""
    try:
        with open(path, encoding="utf-8") as handle, ExamplesWriter(scratch, np.uint8) as out:
            header = handle.readline().rstrip("\r\n")
            if header != HEADER:
                raise DataError(f"{path}: the first line is {header[:40]!r}, expected the header "
                                f"'Source<TAB>Target'; {GET_IT}")
            for number, line in enumerate(handle, start=2):
                out.append(*parse_line(line, f"{path}:{number}"))
                advance(1)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path} ({exc}); {GET_IT}") from exc
    if not len(out):
        raise DataError(f"{path} holds no examples; {GET_IT}")
    return out.finish()


def parse_line(line: str, where: str) -> tuple[list[int], int]:
    """The token ids and label of one line of a released file (``where``: its file:line, for the ``DataError``).

    A truncated or damaged file must not train on corrupt examples: the expression has to be well formed and its
    label to be its value, as every label of LRA's release is (``listops.evaluate`` is LRA's ``to_value``).
    """
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 2:
        raise DataError(f"{where}: expected 2 tab-separated fields, got {len(fields)}; {GET_IT}")
    try:
        tokens = listops.encode(fields[0])
    except KeyError as exc:
        raise DataError(f"{where}: unknown ListOps token {exc.args[0]!r}; {GET_IT}") from None
    target = fields[1].strip()
    # isdigit() alone also accepts digits int() refuses ("²"): ASCII only
    if not (target.isascii() and target.isdigit()) or int(target) >= listops.N_CLASSES:
        raise DataError(f"{where}: the target {fields[1][:20]!r} is not a digit 0-9; {GET_IT}")
    try:
        value = listops.evaluate(tokens)
    except ValueError as exc:
        raise DataError(f"{where}: the expression is malformed: {exc}; {GET_IT}") from None
    if value != int(fields[1]):
        raise DataError(f"{where}: the target is {int(fields[1])}, but the expression's value is {value} (a label "
                        f"of the release is its expression's value); {GET_IT}")
    return tokens, value


GeneratedCount = Annotated[Positive, WITHOUT_PATH]
AtLeastTwo = Annotated[int, Rules(min=2), WITHOUT_PATH]


def load_listops(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                 n_train: GeneratedCount = 96_000, n_validation: GeneratedCount = 2_000,
                 n_test: GeneratedCount = 2_000, seed: Annotated[NonNegative, WITHOUT_PATH] = 0,
                 max_depth: AtLeastTwo = 10, max_args: AtLeastTwo = 10, min_length: GeneratedCount = 500,
                 max_length: AtLeastTwo = 2000) -> ClassificationData:
    """ListOps: generated (default; sizes, seed and limits are options) or the LRA release (``data_path``).

    The generation options apply without ``data_path`` only (given with it, they are refused); the release's
    longest expression sets ``max_len`` then.
    """
    if data_path is not None:
        files = find_release_files(data_path, RELEASE_FILES, what="ListOps", get_it=GET_IT)
        # format 2 checks every line's expression and label: a cache of format 1 may hold what it refuses
        splits = cached_splits("listops", files.values(), {"format": 2},
                               lambda scratch, advance: {s: read_tsv(files[s], scratch / s, advance) for s in SPLITS},
                               cache_dir, unit="line")
        max_len = max(int(e.lengths.max()) for e in splits.values())
        metadata = {"source": str(Path(data_path)), "generated": False}
    else:
        sizes = {"train": n_train, "validation": n_validation, "test": n_test}
        options = dict(seed=seed, max_depth=max_depth, max_args=max_args, min_length=min_length,
                       max_length=max_length)
        key = {"generator": "lra-listops-1", "sizes": sizes, **options}
        splits = cached_splits("listops", (), key, lambda _, advance: generated_splits(sizes, options, advance),
                               cache_dir, total=sum(sizes.values()), unit="expression")
        max_len = max_length - 1
        metadata = {"generated": True, **key}
    return ClassificationData("listops", splits, vocab_size=len(listops.VOCAB), n_classes=listops.N_CLASSES,
                              max_len=max_len, pad_id=listops.PAD_ID, class_names=listops.DIGITS,
                              metadata=metadata)


def generated_splits(sizes: dict[str, int], options: dict, advance: Advance = no_progress) -> dict[str, Examples]:
    """Generate ``sum(sizes)`` distinct expressions (``advance`` counts them) and cut them into the splits in order."""
    sequences = listops.generate(sum(sizes.values()), advance=advance, **options)
    splits, start = {}, 0
    for split in SPLITS:
        part = sequences[start:start + sizes[split]]
        splits[split] = Examples.ragged(part, listops.labelled(part), dtype=np.uint8)
        start += sizes[split]
    return splits
