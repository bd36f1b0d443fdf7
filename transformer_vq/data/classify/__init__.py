"""Sequence-classification datasets (LongVQ / Long Range Arena): labelled token sequences per split.

Use :func:`load_classification` (``"listops"``, ``"fashion-mnist"``, ``"digits"``, ``"cifar10"``,
``"pathfinder"``, ``"imdb"``, ``"aan"``); it returns a :class:`ClassificationData` whose splits
are :class:`Examples`, batched by :class:`ClassBatches` (training) and :func:`ordered_batches`
(evaluation) into ``(ids [B, T], mask [B, T], labels [B])``. docs/datasets.md describes each dataset.
"""

from transformer_vq.data.classify.batching import ClassBatches, ordered_batches, pad_batch
from transformer_vq.data.classify.examples import ClassificationData, Examples
from transformer_vq.data.classify.registry import dataset_identity, list_classification, load_classification

__all__ = ["ClassBatches", "ClassificationData", "Examples", "dataset_identity", "list_classification",
           "load_classification", "ordered_batches", "pad_batch"]
