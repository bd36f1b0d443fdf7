"""Per-code summaries of the keys a non-causal query sees through their code (Theorems 3.4-3.5, LongVQ eqs. 17-18).

Every key of the sequence enters through its code: one ``(count, mean)`` summary per group over the whole sequence
(:func:`masked_summary` over ``T``). With the three-block window the window's keys are then corrected key by key
(:func:`transformer_vq.ops.vq_bidir.scoring.combine_corrected`), so no summary per block is needed; packed documents
sum per block (:mod:`transformer_vq.ops.vq_bidir.documents`). A sum over one sequence stays within what float32 holds
(the causal cache, carried over sequences of any length, merges means instead: ``transformer_vq.ops.vq.cache``).

Padding keys (``real`` False) are counted under one extra code ``S`` that is dropped afterwards: they take no part in
any count or mean, and ``summed`` (the causal cache's per-code sums) is reused unchanged.

Letters: B batch, G key/value groups, T positions, N blocks, L block length, S codewords, Dv value width.
"""

from __future__ import annotations

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
