"""The fused backward kernels of VQ attention over whole blocks: recompute the weights, never store them.

With ``p = exp(s - lse)`` (``lse`` saved by the forward), ``dp = dO v^T`` and ``D = dO . O`` per row, the score
gradient is ``ds = p (dp - D)`` (flash-attention's backward). Three kernels, each accumulating one gradient in
registers without atomics:

* :func:`query_grad_kernel`, one program per (batch * head, query tile): ``dq = ds @ [C; k]`` over codewords and
  window keys, and ``dbias = ds`` of the window columns;
* :func:`window_grad_kernel`, one program per (batch * group, tile of keys of ``k_all``): ``dk = ds^T q`` and
  ``dv = p^T dO`` over the heads of the group and the two query blocks whose window holds the keys;
* :func:`cache_grad_kernel`, one program per (batch * group, block, tile of codes): ``d mean = p^T dO`` over the heads
  of the group and the rows of the block. The codebook and the log-counts get no gradient (constants).

Operands as in :mod:`transformer_vq.ops.vq.triton.forward`, plus ``dO [B, H, T, Dv]``, ``lse`` and ``D [B, H, T]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from transformer_vq.ops.vq.triton.tiles import codeword_scores, load_rows, window_scores, window_visible


@triton.jit
def query_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, do_ptr, lse_ptr, delta_ptr,
                      dq_ptr, dbias_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """``dq [B, H, T, Dk]`` and the window columns of ``dbias [B, H, T, 2L]`` (zeros elsewhere) of one query tile."""
    bh = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    m_tiles = tl.cdiv(L, BLOCK_M)
    n = tile // m_tiles
    first_row = (tile % m_tiles) * BLOCK_M
    g = (bh % H) // R
    bg = (bh // H) * (H // R) + g
    rows_in_block = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows_in_block < L
    rows = n * L + rows_in_block
    q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, BLOCK_DK)
    do = load_rows(do_ptr + bh * T * Dv, rows, row_ok, Dv, BLOCK_DV)
    lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * T + rows, mask=row_ok, other=0.0)

    dq = tl.zeros((BLOCK_M, BLOCK_DK), tl.float32)
    cache = bg * (T // L) + n
    for s0 in range(0, S, BLOCK_S):
        codes = s0 + tl.arange(0, BLOCK_S)
        s, c = codeword_scores(q, cb_ptr + g * S * Dk, lc_ptr + cache * S, codes, S, Dk, BLOCK_DK, PRECISION)
        means = load_rows(cm_ptr + cache * S * Dv, codes, codes < S, Dv, BLOCK_DV)
        p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do.to(tl.float32), tl.trans(means), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(c.dtype), c, input_precision=PRECISION)

    first_col = tl.where((n == 0) & (has_prev == 0), L, 0)
    window = bg * (T + L) + n * L
    bias_rows = (bh * T + n * L) * 2 * L
    for j0 in range(0, L + first_row + BLOCK_M, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        visible = window_visible(rows_in_block, row_ok, cols, L, first_col)
        col_ok = cols < 2 * L
        k = load_rows(k_ptr + window * Dk, cols, col_ok, Dk, BLOCK_DK)
        s = window_scores(q, k, bias_ptr + bias_rows, rows_in_block, visible, cols, L, PRECISION)
        values = load_rows(v_ptr + window * Dv, cols, col_ok, Dv, BLOCK_DV)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(values), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.store(dbias_ptr + bias_rows + rows_in_block[:, None] * (2 * L) + cols[None, :], ds, mask=visible)

    dk_cols = tl.arange(0, BLOCK_DK)
    tl.store(dq_ptr + (bh * T + rows[:, None]) * Dk + dk_cols[None, :], dq,
             mask=row_ok[:, None] & (dk_cols[None, :] < Dk))


@triton.jit
def _window_key_grads(q_ptr, bias_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, keys, key_ok, bh, n, col0,
                      start, T, L, Dk, Dv, BLOCK_M: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                      PRECISION: tl.constexpr):
    """Add to ``dk, dv`` what the rows ``start ..`` of query block ``n`` of head ``bh`` give the keys at window
    columns ``col0 + keys``."""
    cols = col0 + keys
    for m0 in range(start, L, BLOCK_M):
        rows_in_block = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows_in_block < L
        rows = n * L + rows_in_block
        visible = window_visible(rows_in_block, row_ok, cols, L, 0) & key_ok[None, :]
        q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, BLOCK_DK)
        do = load_rows(do_ptr + bh * T * Dv, rows, row_ok, Dv, BLOCK_DV)
        lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
        delta = tl.load(delta_ptr + bh * T + rows, mask=row_ok, other=0.0)
        s = window_scores(q, k, bias_ptr + (bh * T + n * L) * 2 * L, rows_in_block, visible, cols, L, PRECISION)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def window_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, do_ptr, lse_ptr, delta_ptr,
                       dk_ptr, dv_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                       BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """``dk [B, G, T + L, Dk]``, ``dv [B, G, T + L, Dv]`` of one tile of keys of block ``c`` of ``k_all``.

    Block ``c`` of ``k_all`` is the previous block of query block ``c`` (columns ``0 .. L-1`` of its window) and the
    present block of query block ``c - 1`` (columns ``L .. 2L-1``). Block -1 (``c = 0``) without real keys gets zeros.
    """
    bg = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    k_tiles = tl.cdiv(L, BLOCK_N)
    c = tile // k_tiles
    first_key = (tile % k_tiles) * BLOCK_N
    keys = first_key + tl.arange(0, BLOCK_N)
    key_ok = keys < L
    G = H // R
    at = bg * (T + L) + c * L  # row of k_all / v_all of the block's first key
    k = load_rows(k_ptr + at * Dk, keys, key_ok, Dk, BLOCK_DK)
    v = load_rows(v_ptr + at * Dv, keys, key_ok, Dv, BLOCK_DV)
    dk = tl.zeros((BLOCK_N, BLOCK_DK), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    for r in range(R):
        bh = (bg // G) * H + (bg % G) * R + r
        if (c < T // L) & ((c > 0) | (has_prev != 0)):
            dk, dv = _window_key_grads(q_ptr, bias_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, keys, key_ok, bh,
                                       c, 0, 0, T, L, Dk, Dv, BLOCK_M, BLOCK_DK, BLOCK_DV, PRECISION)
        if c > 0:
            # As the block's own keys, only rows at or after a key see it: earlier row tiles are skipped.
            dk, dv = _window_key_grads(q_ptr, bias_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, keys, key_ok, bh,
                                       c - 1, L, first_key // BLOCK_M * BLOCK_M, T, L, Dk, Dv, BLOCK_M, BLOCK_DK,
                                       BLOCK_DV, PRECISION)
    dk_cols, dv_cols = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    tl.store(dk_ptr + (at + keys[:, None]) * Dk + dk_cols[None, :], dk, mask=key_ok[:, None] & (dk_cols[None, :] < Dk))
    tl.store(dv_ptr + (at + keys[:, None]) * Dv + dv_cols[None, :], dv, mask=key_ok[:, None] & (dv_cols[None, :] < Dv))


@triton.jit
def cache_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, do_ptr, lse_ptr, delta_ptr,
                      dmean_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """``d cache_mean [B, G, N, S, Dv]`` of one tile of codes of one query block: ``p^T dO`` over its rows."""
    bg = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    s_tiles = tl.cdiv(S, BLOCK_S)
    n = tile // s_tiles
    codes = (tile % s_tiles) * BLOCK_S + tl.arange(0, BLOCK_S)
    G = H // R
    cache = bg * (T // L) + n
    dmean = tl.zeros((BLOCK_S, BLOCK_DV), tl.float32)
    for r in range(R):
        bh = (bg // G) * H + (bg % G) * R + r
        for m0 in range(0, L, BLOCK_M):
            rows_in_block = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows_in_block < L
            rows = n * L + rows_in_block
            q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, BLOCK_DK)
            do = load_rows(do_ptr + bh * T * Dv, rows, row_ok, Dv, BLOCK_DV)
            lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
            s, _ = codeword_scores(q, cb_ptr + (bg % G) * S * Dk, lc_ptr + cache * S, codes, S, Dk, BLOCK_DK,
                                   PRECISION)
            p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
            dmean += tl.dot(tl.trans(p), do.to(tl.float32), input_precision=PRECISION)
    dv_cols = tl.arange(0, BLOCK_DV)
    tl.store(dmean_ptr + (cache * S + codes[:, None]) * Dv + dv_cols[None, :], dmean,
             mask=(codes[:, None] < S) & (dv_cols[None, :] < Dv))
