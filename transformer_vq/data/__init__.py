"""Datasets: each loader returns a :class:`~transformer_vq.data.corpus.Corpus`.

Use :func:`load_corpus` (``"shakespeare"``, ``"text"``, ``"enwik8"``, ``"pg19"``,
``"imagenet64"``, ``"gcide"``); problems a user can fix raise :class:`DataError`. Downloads and
derived files live in the user cache (``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
"""

from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.registry import list_corpora, list_probes, load_corpus

__all__ = ["Corpus", "DataError", "list_corpora", "list_probes", "load_corpus"]
