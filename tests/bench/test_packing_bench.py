"""The packing benchmark's documents: rows cut into documents of the asked mean length, positions restarting at 0."""

from __future__ import annotations

import torch

from transformer_vq.bench.packing import document_positions
from transformer_vq.ops.documents import document_starts


def test_rows_are_cut_into_documents_of_the_mean_length():
    positions = document_positions(4, 5000, 50, seed=3)
    assert positions.shape == (4, 5000)
    starts = document_starts(4, 5000, position_ids=positions)  # valid packed positions, or this raises
    assert bool(starts[:, 0].all())
    mean = starts.numel() / int(starts.sum())
    assert 40 < mean < 60, mean
    assert torch.equal(positions, document_positions(4, 5000, 50, seed=3))
