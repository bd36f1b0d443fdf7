"""Datasets: each loader returns a :class:`~transformer_vq.data.corpus.Corpus`."""

from transformer_vq.data.corpus import Corpus

__all__ = ["Corpus"]
