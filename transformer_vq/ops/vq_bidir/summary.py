"""Per-code summaries of the keys a non-causal query sees through their code (Theorems 3.4-3.5, LongVQ eqs. 17-18).

Without a bias every key of the sequence enters through its code: one ``(count, mean)`` summary per group over the
whole sequence (:func:`masked_summary` over ``T``). With the three-block window, the query block ``n`` sees the keys of
blocks ``n - 1 .. n + 1`` directly and every other key through its code: the per-code sums of blocks ``< n - 1`` (a
running sum from the front) plus those of blocks ``> n + 1`` (one from the back), divided by their count once
(:func:`outside_window_summary`). Only additions, never the whole sequence minus the window, so there is no
cancellation; a sum over one sequence stays within what float32 holds (the causal cache, carried over sequences of
any length, merges means instead: ``transformer_vq.ops.vq.cache``).

Padding keys (``real`` False) are counted under one extra code ``S`` that is dropped afterwards: they take no part in
any count or mean, and ``summarize`` is reused unchanged.

Letters: B batch, G key/value groups, T positions, N blocks, L block length, S codewords, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.vq.cache import summarize, summed


def masked_summary(z: torch.Tensor, v: torch.Tensor, real: torch.Tensor, n_code: int):
    """Count and mean of the values of real keys per code, over the second-to-last axis.

    Args:
        z: ``[B, G, ..., W]`` shortcodes. v: ``[B, G, ..., W, Dv]`` values. real: ``[B, ..., W]`` bool, False for
            padding keys (shared by every group).
    Returns:
        ``count [B, G, ..., S]`` (float32) and ``mean [B, G, ..., S, Dv]`` (at least float32; 0 for unused codes).
    """
    codes = torch.where(real.unsqueeze(1), z, n_code)  # padding keys go to the extra code S
    count, mean = summarize(codes, v, n_code + 1, torch.promote_types(v.dtype, torch.float32))
    return count[..., :n_code], mean[..., :n_code, :]


def outside_window_summary(z: torch.Tensor, v: torch.Tensor, real: torch.Tensor, n_code: int, block_len: int):
    """For each query block ``n``, the summary of the real keys of blocks ``< n - 1`` and ``> n + 1``.

    Args:
        z: ``[B, G, N L]`` shortcodes. v: ``[B, G, N L, Dv]`` values. real: ``[B, N L]`` bool.
        n_code: ``S``. block_len: ``L``.
    Returns:
        ``count [B, G, N, S]`` and ``mean [B, G, N, S, Dv]``.
    """
    B, G, T = z.shape
    L, Dv = block_len, v.shape[-1]
    N = T // L
    codes = torch.where(real.view(B, 1, N, L), z.view(B, G, N, L), n_code)  # padding keys go to the extra code S
    counts, sums = summed(codes, v.view(B, G, N, L, Dv), n_code + 1, torch.promote_types(v.dtype, torch.float32))
    count, total = OutsideBlocks.apply(counts[..., :n_code]), OutsideBlocks.apply(sums[..., :n_code, :])
    # in place: the sum is a fresh tensor that nothing saved for the backward
    return count, total.div_(count.clamp(min=1.0).unsqueeze(-1).to(total.dtype))


def outside_blocks(per_block: torch.Tensor) -> torch.Tensor:
    """``out[:, :, n] = sum of per_block[:, :, i]`` over the blocks ``i < n - 1`` and ``i > n + 1`` (``[B, G, N, ...]``).

    A running sum from the front plus one from the back, each one in-place addition per block into a buffer of one
    block's size: only additions, so no cancellation (never the whole sequence minus the window), and no merge,
    gather or flip of ``[N, S, Dv]`` summaries (``cumsum`` along a middle axis is several times slower on a CPU).
    """
    N = per_block.shape[2]
    out = torch.empty_like(per_block)
    out[:, :, :2].zero_()
    running = torch.zeros_like(per_block[:, :, 0])
    for n in range(2, N):  # blocks 0 .. n-2
        out[:, :, n].copy_(running.add_(per_block[:, :, n - 2]))
    running.zero_()
    for n in range(N - 3, -1, -1):  # blocks n+2 .. N-1
        out[:, :, n].add_(running.add_(per_block[:, :, n + 2]))
    return out


class OutsideBlocks(torch.autograd.Function):
    """:func:`outside_blocks` with its gradient: the map is ``out_n = sum_i [|n - i| >= 2] x_i``, whose matrix is
    symmetric, so the gradient of ``x`` is the same map applied to the gradient of ``out``."""

    @staticmethod
    def forward(per_block: torch.Tensor) -> torch.Tensor:
        return outside_blocks(per_block)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return outside_blocks(grad.contiguous())
