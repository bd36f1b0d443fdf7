"""The window bias in block form (used by the kernels) equals its position-by-position form (used by the naive ones)."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.ops.window import row_blocks, window_bias, window_bias_dense


@pytest.mark.parametrize("length,block_len", [(1, 4), (13, 4), (37, 8)], ids=lambda x: str(x))
def test_block_form_equals_dense_form(length, block_len):
    bias = torch.randn(2, 3, length, 2 * block_len, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(length)
    beta, visible = window_bias(bias, pos, pos, block_len)
    assert torch.equal(beta, window_bias_dense(bias, block_len))
    assert torch.equal(visible, torch.ones(length, length, dtype=torch.bool).tril())


def test_dense_form_by_hand():
    """L = 2: query 5 (block 2) sees keys 2..5 through columns 0..3; keys 0, 1 get no bias."""
    bias = torch.arange(6 * 4, dtype=torch.float64).view(1, 1, 6, 4) + 1
    beta = window_bias_dense(bias, 2)[0, 0]
    assert beta[5].tolist() == [0, 0, 21, 22, 23, 24]
    assert beta[2].tolist() == [9, 10, 11, 0, 0, 0]  # block 1: window starts at 0
    assert beta[1].tolist() == [7, 8, 0, 0, 0, 0]  # block 0: window starts at -2, columns 2, 3 are keys 0, 1


def test_row_blocks_split_at_absolute_blocks():
    assert list(row_blocks(offset=3, length=7, block_len=4)) == [(0, 1, 0), (1, 5, 0), (5, 7, 4)]
