"""Batches over a split: deterministic order, exact resume, disjoint shards that add up to the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_vq.data.batches import TokenBatches

TOKENS = np.arange(1000)  # token value = position, so a window shows where it starts


def take(batches, n):
    return [next(batches) for _ in range(n)]


def test_windows_are_contiguous_with_one_extra_token():
    batches = TokenBatches(TOKENS, batch_size=4, seq_len=10, seed=0)
    batch = next(batches)
    assert batch.shape == (4, 11) and batch.dtype == torch.long
    for row in batch:
        start = int(row[0])
        assert start % 10 == 0
        assert torch.equal(row, torch.from_numpy(TOKENS[start:start + 11]))


def test_epoch_visits_every_window_once_and_reshuffles():
    batches = TokenBatches(TOKENS, batch_size=9, seq_len=10, seed=3)  # 99 windows -> 11 batches per epoch
    first = torch.cat(take(batches, 11))[:, 0]
    assert sorted(first.tolist()) == sorted((TOKENS[np.arange(99) * 10]).tolist())
    assert batches.epoch == 1 and batches.index == 0
    second = torch.cat(take(batches, 11))[:, 0]
    assert not torch.equal(first, second)


def test_resume_continues_exactly():
    a = TokenBatches(TOKENS, batch_size=4, seq_len=10, seed=1)
    take(a, 30)  # crosses an epoch boundary (24 batches per epoch)
    saved = a.state_dict()
    expected = take(a, 5)
    b = TokenBatches(TOKENS, batch_size=4, seq_len=10, seed=1)
    b.load_state_dict(saved)
    assert all(torch.equal(x, y) for x, y in zip(expected, take(b, 5)))


def test_resume_with_other_settings_is_refused():
    saved = TokenBatches(TOKENS, batch_size=4, seq_len=10).state_dict()
    with pytest.raises(ValueError, match=r"^cannot resume the data position: it was saved with batch_size=4 but this "
                                         r"run has batch_size=8; resume with the same data and batch settings"):
        TokenBatches(TOKENS, batch_size=8, seq_len=10).load_state_dict(saved)


def test_shards_partition_the_global_batch():
    whole = take(TokenBatches(TOKENS, batch_size=6, seq_len=10, seed=2), 3)
    shards = [take(TokenBatches(TOKENS, batch_size=6, seq_len=10, seed=2, rank=r, world_size=3), 3) for r in range(3)]
    for step in range(3):
        assert torch.equal(whole[step], torch.cat([shard[step] for shard in shards]))


def test_batch_size_must_divide_over_workers():
    with pytest.raises(ValueError, match=r"^batch_size=5 must be a multiple of the number of data-parallel workers "
                                         r"\(2\); set batch_size to a multiple of 2$"):
        TokenBatches(TOKENS, batch_size=5, seq_len=10, world_size=2)
