"""The two-block window bias that every attention operator takes, expanded to score-matrix form.

Every operator receives ``bias [B, H, T, 2L]``: for the query at absolute position ``tau`` the window starts at
``w(tau) = (tau // L - 1) * L``, column ``j`` of its bias row belongs to the key at position ``w(tau) + j``, and a key
at position ``p`` gets

    beta[t, p] = bias[t, p - w(tau)]   if  w(tau) <= p <= tau
    beta[t, p] = 0                      if  p < w(tau)

(docs/operator.md, "The window bias"). The VQ operator reads ``bias`` column by column; the baselines attend keys
directly, so they need ``beta`` as dense blocks of a score matrix (``window_bias``, never the whole ``T x T`` matrix);
the naive references build the whole matrix position by position (``window_bias_dense``).

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


def window_bias_dense(bias: torch.Tensor, block_len: int) -> torch.Tensor:
    """``beta [B, H, T, T]`` of a whole sequence starting at position 0, filled in position by position.

    The slow, obviously right form of :func:`window_bias` for the naive references (zero outside the window and for
    future keys; the causal mask is the caller's).
    """
    batch, n_head, length, _ = bias.shape
    beta = torch.zeros(batch, n_head, length, length, dtype=bias.dtype, device=bias.device)
    for t in range(length):
        window = (t // block_len - 1) * block_len  # w(t); keys p in [max(w, 0), t] take column p - w
        first = max(window, 0)
        beta[:, :, t, first:t + 1] = bias[:, :, t, first - window:t + 1 - window]
    return beta


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
