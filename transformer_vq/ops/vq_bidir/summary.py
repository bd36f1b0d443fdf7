"""Per-code summaries of the keys a non-causal query sees through their code (Theorems 3.4-3.5, LongVQ eqs. 17-18).

Without a bias every key of the sequence enters through its code: one ``(count, mean)`` summary per group over the
whole sequence (:func:`masked_summary` over ``T``). With the three-block window, the query block ``n`` sees the keys of
blocks ``n - 1 .. n + 1`` directly and every other key through its code: the per-code sums of blocks ``< n - 1`` (a
running sum from the front) plus those of blocks ``> n + 1`` (one from the back), divided by their count once
(:func:`outside_window_summary`). Only additions, never the whole sequence minus the window, so there is no
cancellation; a sum over one sequence stays within what float32 holds (the causal cache, carried over sequences of
any length, merges means instead: ``transformer_vq.ops.vq.cache``).

Padding keys (``real`` False) are counted under one extra code ``S`` that is dropped afterwards: they take no part in
any count or mean, and ``summed`` (the causal cache's per-code sums) is reused unchanged.

Letters: B batch, G key/value groups, T positions, N blocks, L block length, S codewords, Dv value width.
"""

from __future__ import annotations

import math

import torch

from transformer_vq.ops.vq.cache import per_code_mean, summed


def masked_summary(z: torch.Tensor, v: torch.Tensor, real: torch.Tensor, n_code: int):
    """Count and mean of the values of real keys per code, over the second-to-last axis.

    Args:
        z: ``[B, G, ..., W]`` shortcodes. v: ``[B, G, ..., W, Dv]`` values. real: ``[B, ..., W]`` bool, False for
            padding keys (shared by every group).
    Returns:
        ``count [B, G, ..., S]`` (float32) and ``mean [B, G, ..., S, Dv]`` (at least float32; 0 for unused codes).
    """
    count, sums = masked_sums(z, v, real, n_code)
    return count, per_code_mean(count, sums)


def masked_sums(z: torch.Tensor, v: torch.Tensor, real: torch.Tensor, n_code: int):
    """:func:`masked_summary` before its division: the count and the sum of the values of real keys per code."""
    codes = torch.where(real.unsqueeze(1), z, n_code)  # padding keys go to the extra code S
    count, sums = summed(codes, v, n_code + 1, torch.promote_types(v.dtype, torch.float32))
    return count[..., :n_code], sums[..., :n_code, :]


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
    counts, sums = masked_sums(z.view(B, G, N, L), v.view(B, G, N, L, Dv), real.view(B, N, L), n_code)
    count = OutsideBlocks.apply(counts)
    return count, per_code_mean(count, OutsideBlocks.apply(sums))


def outside_blocks(per_block: torch.Tensor) -> torch.Tensor:
    """``out[:, :, n] = sum of per_block[:, :, i]`` over the blocks ``i < n - 1`` and ``i > n + 1`` (``[B, G, N, ...]``).

    A running sum from the front plus one from the back (:func:`running_sum`): only additions, so no cancellation
    (never the whole sequence minus the window), and no merge, gather or flip of ``[N, S, Dv]`` summaries.
    """
    N = per_block.shape[2]
    out = torch.empty_like(per_block)
    out[:, :, :2].zero_()
    if N > 2:
        running_sum(out[:, :, 2:].copy_(per_block[:, :, :N - 2]))  # blocks 0 .. n-2
        out[:, :, :N - 2].add_(running_sum(per_block[:, :, 2:].clone(), reverse=True))  # blocks n+2 .. N-1
    return out


def running_sum(x: torch.Tensor, *, reverse: bool = False) -> torch.Tensor:
    """``x[:, :, i] <- sum of x[:, :, j]`` for ``j <= i`` (``j >= i`` when ``reverse``), in place; returns ``x``.

    In two levels over groups of ``g ~ sqrt(N)`` blocks: a running sum inside every group at once (``g`` additions,
    each over all groups), then each group adds the total before it (``N / g`` additions). About ``2 sqrt(N)``
    operations, not ``N``: on a shared CPU every operation can wait a time slice for its other thread, and
    ``cumsum`` along a middle axis is several times slower than these additions.
    """
    N = x.shape[2]
    g = max(1, math.isqrt(N))
    steps = range(g - 2, -1, -1) if reverse else range(1, g)
    for j in steps:  # inside the groups: position j of every group takes its neighbour's running sum
        target, source = x[:, :, j::g], x[:, :, j + 1::g] if reverse else x[:, :, j - 1::g]
        n = min(target.shape[2], source.shape[2])
        target[:, :, :n].add_(source[:, :, :n])
    starts = range(-(-N // g) - 2, -1, -1) if reverse else range(1, -(-N // g))
    for i in starts:  # across the groups: the running total of the groups before (after) this one
        edge = (i + 1) * g if reverse else i * g - 1
        x[:, :, i * g:(i + 1) * g].add_(x[:, :, edge:edge + 1])
    return x


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
