"""``aan``: LRA Retrieval, citation links between ACL Anthology Network papers, as byte sequences.

LRA's release has ``tsv_data/new_aan_pairs.train.tsv``, ``new_aan_pairs.eval.tsv`` and
``new_aan_pairs.test.tsv``: no header, one pair per line with five tab-separated fields -- the
label (``1``/``0``, possibly written ``1.0``/``0.0``: whether one paper cites the other), the two
paper ids, and the two texts. LRA encodes each text as bytes truncated to 4,000 (``max_doc_len``)
and compares them in a two-tower model. Here the pair is *one* sequence, so that the same
``[B, T]`` ids + mask interface serves every dataset: the first text's bytes, the separator
token 256, the second text's bytes (vocabulary 257, at most ``2 * max_doc_len + 1`` tokens).
A two-tower model can cut a sequence at ``separator_id`` (in ``metadata``). The files are read
line by line into the cache once and memory-mapped afterwards; the texts are taken verbatim.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from transformer_vq.config.choices import SPLITS
from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.classify.release import find_release_files
from transformer_vq.data.classify.store import ExamplesWriter, cached_splits
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import Positive
from transformer_vq.data.progress import Advance, no_progress

SEPARATOR_ID = 256
RELEASE_FILES = {"train": "new_aan_pairs.train.tsv", "validation": "new_aan_pairs.eval.tsv",
                 "test": "new_aan_pairs.test.tsv"}
LABELS = {"0": 0, "1": 1, "0.0": 0, "1.0": 1}
GET_IT = ("pass --data-path with the directory of LRA's release holding new_aan_pairs.train.tsv, "
          "new_aan_pairs.eval.tsv and new_aan_pairs.test.tsv (lra_release/tsv_data)")


def encode_pair(first: str, second: str, max_doc_len: int) -> np.ndarray:
    """The pair as one ``uint16`` sequence: first text's bytes, separator, second text's bytes (each truncated)."""
    # surrogateescape gives back the file's exact bytes where they were not valid UTF-8
    first_bytes, second_bytes = (text.encode("utf-8", "surrogateescape")[:max_doc_len] for text in (first, second))
    return np.concatenate([np.frombuffer(first_bytes, dtype=np.uint8), [SEPARATOR_ID],
                           np.frombuffer(second_bytes, dtype=np.uint8)]).astype(np.uint16)


def read_tsv(path: Path, max_doc_len: int, scratch: Path, advance: Advance = no_progress) -> Examples:
    """The pairs and labels of one released TSV file, streamed through a token file at ``scratch``
    (``DataError`` naming file and line; ``advance`` counts the pairs)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as handle, \
                ExamplesWriter(scratch, np.uint16) as out:
            for number, line in enumerate(handle, start=1):
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 5:
                    raise DataError(f"{path}:{number}: expected 5 tab-separated fields (label, id1, id2, text1, "
                                    f"text2), got {len(fields)}; {GET_IT}")
                if fields[0] not in LABELS:
                    raise DataError(f"{path}:{number}: the label {fields[0][:20]!r} is not 0 or 1; {GET_IT}")
                out.append(encode_pair(fields[3], fields[4], max_doc_len), LABELS[fields[0]])
                advance(1)
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc}); {GET_IT}") from exc
    if not len(out):
        raise DataError(f"{path} holds no pairs; {GET_IT}")
    return out.finish()


def load_aan(data_path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
             max_doc_len: Positive = 4000) -> ClassificationData:
    """AAN pairs as one byte sequence each (2 classes: not linked, linked)."""
    files = find_release_files(data_path, RELEASE_FILES, what="aan", get_it=GET_IT)
    options = {"max_doc_len": max_doc_len, "format": 1}
    splits = cached_splits("aan", files.values(), options,
                           lambda scratch, advance: {s: read_tsv(files[s], max_doc_len, scratch / s, advance)
                                                     for s in SPLITS},
                           cache_dir, unit="pair")
    return ClassificationData("aan", splits, vocab_size=SEPARATOR_ID + 1, n_classes=2, max_len=2 * max_doc_len + 1,
                              class_names=("not linked", "linked"),
                              metadata={"source": str(Path(data_path)), "tokenization": "bytes",
                                        "separator_id": SEPARATOR_ID, "max_doc_len": max_doc_len})
