"""Padded batches of labelled sequences: ``(ids [B, T], mask [B, T], labels [B])``, resumable.

A batch is padded to its longest sequence (or to a fixed ``length``) with the dataset's ``pad_id``;
``mask`` is ``True`` on real tokens. Training batches (:class:`ClassBatches`) visit the examples of
a split in a fresh random order every epoch, drawn from ``(seed, epoch)`` alone, and drop the last
incomplete batch; evaluation (:func:`ordered_batches`) visits every example once, in order. A
data-parallel rank reads its own contiguous slice of every global batch, as for language modelling
(:mod:`transformer_vq.data.batches`), and the position is two integers, so a resumed run sees the
same batches bit for bit.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

from transformer_vq.data.batches import check_resume, epoch_order
from transformer_vq.data.classify.examples import Examples


def pad_batch(examples: Examples, indices: Sequence[int], *, pad_id: int = 0, length: int | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, mask, labels)`` of ``examples[indices]``: ``long [B, T]``, ``bool [B, T]``, ``long [B]``.

    ``T`` is the longest sequence of the batch, or ``length`` when given (a longer sequence is an
    error: truncation belongs to the loaders, which document it).
    """
    rows = [np.asarray(examples[int(i)][0], dtype=np.int64) for i in indices]
    longest = max((len(r) for r in rows), default=0)
    width = longest if length is None else length
    if longest > width:
        raise ValueError(f"a sequence of {longest} tokens does not fit length={width}; raise length or leave it "
                         f"unset to pad each batch to its longest sequence")
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for row, tokens in enumerate(rows):
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = True
    labels = np.asarray(examples.labels[np.asarray(indices, dtype=np.int64)], dtype=np.int64)
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels)


class ClassBatches:
    """An endless, deterministic, resumable iterator of padded training batches from one split.

    Args:
        examples: the split.
        batch_size: global batch size (rows over all ranks); a multiple of ``world_size``.
        seed: fixes the order of examples in every epoch.
        pad_id, length: as :func:`pad_batch`.
        rank, world_size: which slice of every global batch this process reads.
    """

    def __init__(self, examples: Examples, *, batch_size: int, seed: int = 0, pad_id: int = 0,
                 length: int | None = None, rank: int = 0, world_size: int = 1):
        if batch_size <= 0 or batch_size % world_size != 0:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of the number of data-parallel "
                             f"workers ({world_size})")
        if len(examples) < batch_size:
            raise ValueError(f"the split has {len(examples)} examples, fewer than one batch of {batch_size}; "
                             f"lower batch_size")
        self.examples = examples
        self.batch_size = batch_size
        self.seed = seed
        self.pad_id = pad_id
        self.length = length
        self.rank = rank
        self.world_size = world_size
        self.n_examples = len(examples)
        self.batches_per_epoch = self.n_examples // batch_size
        self.epoch = 0
        self.index = 0
        self._order = (-1, None)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._order[0] != self.epoch:
            self._order = (self.epoch, epoch_order(self.n_examples, self.seed, self.epoch))
        rows_per_rank = self.batch_size // self.world_size
        first = self.index * self.batch_size + self.rank * rows_per_rank
        indices = self._order[1][first:first + rows_per_rank]
        self.index += 1
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return pad_batch(self.examples, indices, pad_id=self.pad_id, length=self.length)

    def state_dict(self) -> dict:
        """The position in the stream of batches (plus the settings it is only valid for)."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "batch_size": self.batch_size,
                "n_examples": self.n_examples}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a position saved by :meth:`state_dict` with the same settings and data."""
        check_resume(state, self, ("seed", "batch_size", "n_examples"))
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])


def ordered_batches(examples: Examples, batch_size: int, *, pad_id: int = 0, length: int | None = None,
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every example once, in order, ``batch_size`` at a time (the last batch may be smaller): evaluation."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    for start in range(0, len(examples), batch_size):
        yield pad_batch(examples, range(start, min(start + batch_size, len(examples))), pad_id=pad_id,
                        length=length)
