"""LongVQ's window bias: built from the call's own phases only, equal (bit for bit) to the whole-block table it
replaced, whatever the block length, the call's length and its offset; a short call's cost does not grow with L^2."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_vq.config import longvq_preset
from transformer_vq.models.longvq.layer import LongVQLayer


def layer_of(L, causal, seed=0):
    torch.manual_seed(seed)
    layer = LongVQLayer(longvq_preset("tiny", block_len=L, causal=causal, n_classes=0 if causal else 3)).double()
    with torch.no_grad():
        layer.local_bias.normal_()
    return layer


def whole_block_reference(layer, length, offset):
    """The former formula: the [L, W] table of every phase of the block, tiled, then cut to the call's length."""
    L = layer.cfg.block_len
    columns = torch.arange((2 if layer.cfg.causal else 3) * L)
    phase = (torch.arange(L) + offset) % L
    distance = phase[:, None] + L - columns[None, :]
    index = (distance - layer.first_distance).clamp(0, layer.local_bias.numel() - 1)
    table = layer.local_bias[index].masked_fill(distance < layer.first_distance, 0.0)
    return table.repeat(-(-length // L), 1)[:length]


CASES = [  # (L, length, offset): decoding steps, shorter than a block, exactly a block, longer, ragged
    (4, 1, 0), (4, 1, 3), (4, 1, 6), (8, 1, 13), (8, 3, 0), (8, 3, 6), (8, 5, 7), (4, 4, 2), (4, 13, 0),
    (4, 13, 5), (8, 17, 3), (3, 10, 11), (1, 5, 2), (4, 0, 3),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L,length,offset", CASES)
def test_window_bias_equals_the_whole_block_table(causal, L, length, offset):
    layer = layer_of(L, causal)
    got = layer.window_bias(length, offset)
    want = whole_block_reference(layer, length, offset)
    assert got.shape == want.shape == (length, (2 if causal else 3) * L)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    if length:
        weight = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        g_got, = torch.autograd.grad((got * weight).sum(), layer.local_bias)
        g_want, = torch.autograd.grad((want * weight).sum(), layer.local_bias)
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns while the mode is on."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length", [1, 3])
def test_a_short_call_builds_only_its_own_rows(causal, length):
    """A decoding step (or a sequence shorter than the block) makes tensors of length x W, not L x W: its cost grows
    with L, not L^2 (a block longer than the sequence used to cost O(L^2) memory)."""
    L = 256
    layer = layer_of(L, causal)
    width = (2 if causal else 3) * L
    with torch.no_grad(), LargestTensor() as seen:
        bias = layer.window_bias(length, offset=L + 5)
    assert bias.shape == (length, width)
    assert seen.numel <= max(length * width, layer.local_bias.numel()), seen.numel  # the old table: L * width
