"""The fused backward kernels of VQ attention over whole blocks: recompute the weights, never store them.

With ``p = exp(s - lse)`` (``lse`` saved by the forward), ``dp = dO v^T`` and ``D = dO . O`` per row, the score
gradient is ``ds = p (dp - D)`` (flash-attention's backward). Three kernels, each accumulating one gradient in
registers without atomics:

* :func:`query_grad_kernel`, one program per (batch * head, query tile): ``dq = ds @ [C; k]`` over codewords and
  window keys, and ``dbias = ds`` of the window columns;
* :func:`window_grad_kernel`, one program per (batch * group, tile of keys of ``k_all``, and for values a chunk of
  ``BLOCK_DV`` columns): ``dk = ds^T q`` or ``dv = p^T dO`` over the heads of the group and the two query blocks
  whose window holds the keys;
* :func:`cache_grad_kernel`, one program per (batch * group, block, tile of codes, chunk of value columns):
  ``d mean = p^T dO`` over the heads of the group and the rows of the block. The codebook and the log-counts get no
  gradient (constants).

``dp`` sums over the whole value width ``BLOCK_DV`` columns at a time (:func:`~.tiles.value_products`), so no program
holds a whole wide value row.

Operands as in :mod:`transformer_vq.ops.vq.triton.forward`, plus ``dO [B, H, T, Dv]``, ``lse`` and ``D [B, H, T]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from transformer_vq.ops.vq.triton.tiles import (cache_open, codeword_scores, load_rows, store_rows, value_products,
                                                window_scores, window_visible)


@triton.jit
def query_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, seg_ptr, cseg_ptr,
                      do_ptr, lse_ptr, delta_ptr, dq_ptr, dbias_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, DOCS: tl.constexpr):
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
    q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, 0, BLOCK_DK)
    do_rows = do_ptr + bh * T * Dv
    lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * T + rows, mask=row_ok, other=0.0)
    block_segments = seg_ptr + (bh // H) * (T + L) + n * L
    open_rows = cache_open(block_segments, cseg_ptr + (bh // H) * (T // L) + n, rows_in_block, row_ok, L, DOCS)

    dq = tl.zeros((BLOCK_M, BLOCK_DK), tl.float32)
    cache = bg * (T // L) + n
    for s0 in range(0, S, BLOCK_S):
        codes = s0 + tl.arange(0, BLOCK_S)
        s, c = codeword_scores(q, cb_ptr + g * S * Dk, lc_ptr + cache * S, codes, S, Dk, open_rows, BLOCK_DK,
                               PRECISION)
        p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        dp = value_products(do_rows, rows, row_ok, cm_ptr + cache * S * Dv, codes, codes < S, Dv, BLOCK_DV, PRECISION)
        dq += tl.dot((p * (dp - delta[:, None])).to(c.dtype), c, input_precision=PRECISION)

    first_col = tl.where((n == 0) & (has_prev == 0), L, 0)
    window = bg * (T + L) + n * L
    bias_rows = (bh * T + n * L) * 2 * L
    for j0 in range(0, L + first_row + BLOCK_M, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        visible = window_visible(rows_in_block, row_ok, cols, L, first_col, block_segments, DOCS)
        col_ok = cols < 2 * L
        k = load_rows(k_ptr + window * Dk, cols, col_ok, Dk, 0, BLOCK_DK)
        s = window_scores(q, k, bias_ptr + bias_rows, rows_in_block, visible, cols, L, PRECISION)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (value_products(do_rows, rows, row_ok, v_ptr + window * Dv, cols, col_ok, Dv, BLOCK_DV, PRECISION)
                  - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.store(dbias_ptr + bias_rows + rows_in_block[:, None] * (2 * L) + cols[None, :], ds, mask=visible)
    store_rows(dq_ptr + bh * T * Dk, rows, row_ok, Dk, 0, dq, BLOCK_DK)


@triton.jit
def _window_key_grads(q_ptr, v_ptr, bias_ptr, do_ptr, lse_ptr, delta_ptr, seg_ptr, k, acc, keys, key_ok, bh, n, col0,
                      start, d0, T, L, Dk, Dv, BLOCK_M: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                      GRAD_KEYS: tl.constexpr, PRECISION: tl.constexpr, DOCS: tl.constexpr):
    """Add to ``acc`` what the rows ``start ..`` of query block ``n`` of head ``bh`` give the keys at window columns
    ``col0 + keys``: ``ds^T q`` (``GRAD_KEYS``) or ``p^T dO`` over value columns ``d0 ..``. ``v_ptr`` points at
    the values of these keys, ``seg_ptr`` at the segments of the row of ``bh``."""
    cols = col0 + keys
    for m0 in range(start, L, BLOCK_M):
        rows_in_block = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows_in_block < L
        rows = n * L + rows_in_block
        visible = window_visible(rows_in_block, row_ok, cols, L, 0, seg_ptr + n * L, DOCS) & key_ok[None, :]
        q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, 0, BLOCK_DK)
        lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
        s = window_scores(q, k, bias_ptr + (bh * T + n * L) * 2 * L, rows_in_block, visible, cols, L, PRECISION)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        if GRAD_KEYS:
            delta = tl.load(delta_ptr + bh * T + rows, mask=row_ok, other=0.0)
            dp = value_products(do_ptr + bh * T * Dv, rows, row_ok, v_ptr, keys, key_ok, Dv, BLOCK_DV, PRECISION)
            acc += tl.dot(tl.trans(p * (dp - delta[:, None])).to(q.dtype), q, input_precision=PRECISION)
        else:
            do = load_rows(do_ptr + bh * T * Dv, rows, row_ok, Dv, d0, BLOCK_DV)
            acc += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
    return acc


@triton.jit
def window_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, seg_ptr, cseg_ptr,
                       do_ptr, lse_ptr, delta_ptr, grad_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                       BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
                       DOCS: tl.constexpr, GRAD_KEYS: tl.constexpr):
    """``dk [B, G, T + L, Dk]`` (``GRAD_KEYS``) or ``dv [B, G, T + L, Dv]`` of one tile of keys of block ``c`` of
    ``k_all`` (for ``dv``, ``BLOCK_DV`` columns of it).

    Block ``c`` of ``k_all`` is the previous block of query block ``c`` (columns ``0 .. L-1`` of its window) and the
    present block of query block ``c - 1`` (columns ``L .. 2L-1``). Block -1 (``c = 0``) without real keys gets zeros.
    """
    bg = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_DV
    k_tiles = tl.cdiv(L, BLOCK_N)
    c = tile // k_tiles
    first_key = (tile % k_tiles) * BLOCK_N
    keys = first_key + tl.arange(0, BLOCK_N)
    key_ok = keys < L
    G = H // R
    at = bg * (T + L) + c * L  # row of k_all / v_all of the block's first key
    k = load_rows(k_ptr + at * Dk, keys, key_ok, Dk, 0, BLOCK_DK)
    acc = tl.zeros((BLOCK_N, BLOCK_DK if GRAD_KEYS else BLOCK_DV), tl.float32)
    row_segments = seg_ptr + (bg // G) * (T + L)
    for r in range(R):
        bh = (bg // G) * H + (bg % G) * R + r
        if (c < T // L) & ((c > 0) | (has_prev != 0)):
            acc = _window_key_grads(q_ptr, v_ptr + at * Dv, bias_ptr, do_ptr, lse_ptr, delta_ptr, row_segments, k, acc,
                                    keys, key_ok, bh, c, 0, 0, d0, T, L, Dk, Dv, BLOCK_M, BLOCK_DK, BLOCK_DV,
                                    GRAD_KEYS, PRECISION, DOCS)
        if c > 0:
            # As the block's own keys, only rows at or after a key see it: earlier row tiles are skipped.
            acc = _window_key_grads(q_ptr, v_ptr + at * Dv, bias_ptr, do_ptr, lse_ptr, delta_ptr, row_segments, k, acc,
                                    keys, key_ok, bh, c - 1, L, first_key // BLOCK_M * BLOCK_M, d0, T, L, Dk, Dv,
                                    BLOCK_M, BLOCK_DK, BLOCK_DV, GRAD_KEYS, PRECISION, DOCS)
    if GRAD_KEYS:
        store_rows(grad_ptr + at * Dk, keys, key_ok, Dk, 0, acc, BLOCK_DK)
    else:
        store_rows(grad_ptr + at * Dv, keys, key_ok, Dv, d0, acc, BLOCK_DV)


@triton.jit
def cache_grad_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, seg_ptr, cseg_ptr,
                      do_ptr, lse_ptr, delta_ptr, dmean_ptr, H, R, T, L, S, Dk, Dv, has_prev,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, DOCS: tl.constexpr):
    """``d cache_mean [B, G, N, S, Dv]`` of one tile of codes of one query block (``BLOCK_DV`` columns of it):
    ``p^T dO`` over the block's rows."""
    bg = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_DV
    s_tiles = tl.cdiv(S, BLOCK_S)
    n = tile // s_tiles
    codes = (tile % s_tiles) * BLOCK_S + tl.arange(0, BLOCK_S)
    G = H // R
    cache = bg * (T // L) + n
    dmean = tl.zeros((BLOCK_S, BLOCK_DV), tl.float32)
    block_segments = seg_ptr + (bg // G) * (T + L) + n * L
    for r in range(R):
        bh = (bg // G) * H + (bg % G) * R + r
        for m0 in range(0, L, BLOCK_M):
            rows_in_block = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows_in_block < L
            rows = n * L + rows_in_block
            q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, 0, BLOCK_DK)
            do = load_rows(do_ptr + bh * T * Dv, rows, row_ok, Dv, d0, BLOCK_DV)
            lse = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=0.0)
            open_rows = cache_open(block_segments, cseg_ptr + (bg // G) * (T // L) + n, rows_in_block, row_ok, L,
                                   DOCS)
            s, _ = codeword_scores(q, cb_ptr + (bg % G) * S * Dk, lc_ptr + cache * S, codes, S, Dk, open_rows,
                                   BLOCK_DK, PRECISION)
            p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
            dmean += tl.dot(tl.trans(p), do.to(tl.float32), input_precision=PRECISION)
    store_rows(dmean_ptr + cache * S * Dv, codes, codes < S, Dv, d0, dmean, BLOCK_DV)
