"""Per-code summaries of the keys a non-causal query sees through their code (Theorems 3.4-3.5, LongVQ eqs. 17-18).

Without a bias every key of the sequence enters through its code: one ``(count, mean)`` summary per group over the
whole sequence (:func:`masked_summary` over ``T``). With the three-block window, the query block ``n`` sees the keys of
blocks ``n - 1 .. n + 1`` directly and every other key through its code: the summary of blocks ``< n - 1`` (a prefix over
blocks) merged with the summary of blocks ``> n + 1`` (a suffix) (:func:`outside_window_summary`). The prefix and the
suffix are both built by merges of ``transformer_vq.ops.vq.cache``, never as the whole sequence minus the window, so
there is no cancellation.

Padding keys (``real`` False) are counted under one extra code ``S`` that is dropped afterwards: they take no part in
any count or mean, and ``summarize`` is reused unchanged.

Letters: B batch, G key/value groups, T positions, N blocks, L block length, S codewords, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.vq.cache import merge, prefix_serial, summarize


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
    counts, means = masked_summary(z.view(B, G, N, L), v.view(B, G, N, L, Dv), real.view(B, N, L), n_code)
    empty_count, empty_mean = torch.zeros_like(counts[:, :, 0]), torch.zeros_like(means[:, :, 0])
    # prefix[:, :, i]: blocks 0 .. i-1. suffix[:, :, i]: blocks N-i .. N-1 (a prefix over the reversed blocks).
    prefix_count, prefix_mean = prefix_serial(empty_count, empty_mean, counts, means)
    suffix_count, suffix_mean = prefix_serial(empty_count, empty_mean, counts.flip(2), means.flip(2))
    block = torch.arange(N, device=z.device)
    before = (block - 1).clamp(min=0)  # blocks 0 .. n-2 (none for n <= 1)
    after = (N - 2 - block).clamp(min=0)  # blocks n+2 .. N-1 (none for n >= N-2)
    return merge(prefix_count[:, :, before], prefix_mean[:, :, before],
                 suffix_count[:, :, after], suffix_mean[:, :, after])
