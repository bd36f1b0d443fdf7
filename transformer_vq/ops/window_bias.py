"""The two-block window bias shared by every attention operator, expanded to dense score-matrix form.

Every attention operator of the project takes the same ``bias [B, H, T, 2L]``: a per-(query, offset) bias on the
two-block window of each query (SPEC-vq-attention.md). For a query at absolute position ``tau`` the window starts at
``w(tau) = (tau // L - 1) * L`` and a key at position ``p`` gets

    beta[t, p] = bias[t, p - w(tau)]   if  w(tau) <= p <= tau
    beta[t, p] = 0                      if  p < w(tau)

The baselines (``full``, ``flash_quad``, ``flash``) attend keys directly rather than through a codebook, so they need
``beta`` as dense blocks of a score matrix. This module builds such blocks for some query rows against some key
positions, never the whole ``T x T`` matrix at once.

Letters: B batch, H query heads, L block length, R query rows of a block, P key positions of a block; ``*`` any leading
block dimensions (e.g. the chunk index of FLASH).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def window_bias(bias_rows: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                block_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense window bias ``beta`` and the causal mask of some query rows against some key positions.

    Args:
        bias_rows: ``[B, H, *, R, 2L]``, the rows of ``bias`` for these queries.
        q_pos: ``[*, R]`` int64 absolute positions of the queries.
        k_pos: ``[*, P]`` int64 absolute positions of the keys.
        block_len: ``L``.

    Returns:
        ``beta [B, H, *, R, P]`` (zero outside the window and for future keys) and ``visible [*, R, P]`` (bool: the key
        is not in the query's future, ``p <= tau``).
    """
    window_start = (torch.div(q_pos, block_len, rounding_mode="floor") - 1) * block_len  # [*, R]
    slot = k_pos.unsqueeze(-2) - window_start.unsqueeze(-1)  # [*, R, P] index into the 2L bias slots
    visible = k_pos.unsqueeze(-2) <= q_pos.unsqueeze(-1)  # [*, R, P]
    in_window = (slot >= 0) & visible
    index = slot.clamp(0, 2 * block_len - 1)
    lead = bias_rows.shape[:2]
    beta = torch.gather(bias_rows, -1, index.expand(*lead, *index.shape))  # [B, H, *, R, P]
    return beta.masked_fill(~in_window, 0.0), visible


def row_blocks(offset: int, length: int, block_len: int) -> Iterator[tuple[int, int, int]]:
    """Split the query rows ``[0, length)`` of a call starting at absolute position ``offset`` by absolute block.

    Yields ``(start, stop, window_start)``: rows ``start .. stop-1`` lie in one absolute block of length ``L``, so they
    share one window start (clamped at position 0), and every key before it is attended without bias.
    """
    start = 0
    while start < length:
        tau = offset + start
        stop = min(length, (tau // block_len + 1) * block_len - offset)
        yield start, stop, max((tau // block_len - 1) * block_len, 0)
        start = stop
