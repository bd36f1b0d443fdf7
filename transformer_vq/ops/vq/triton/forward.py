"""The fused forward kernel of VQ attention over whole blocks (Theorem 3.7, flash-attention style).

One program per (batch * head, query tile of a block, chunk of value columns): it scores its queries against the
codewords of their group (plus the log-counts of the block's cache) and against the block's two-block window (plus the
window bias), keeps a running max and normalizer per row (the online softmax), and writes the output and the row's
log-sum-exp for the backward. No ``T x (S + 2L)`` score matrix is ever stored. Wide values are split over programs,
``BLOCK_DV`` columns each (each recomputes the scores, which cost ``Dk``, not ``Dv``, per key). The caches themselves
(``log c`` and the means per block) come from the reductions of :mod:`transformer_vq.ops.vq.cache`, computed in
torch beforehand.

Letters: B batch, H heads, R heads per group, T = N L query rows, S codewords, Dk / Dv key / value widths.
"""

from __future__ import annotations

import triton
import triton.language as tl

from transformer_vq.ops.vq.triton.tiles import (cache_open, codeword_scores, load_rows, online_softmax_step,
                                                store_rows, window_scores, window_visible)


@triton.jit
def forward_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, cb_ptr, lc_ptr, cm_ptr, seg_ptr, cseg_ptr, out_ptr, lse_ptr,
                   H, R, T, L, S, Dk, Dv, has_prev,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                   BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, DOCS: tl.constexpr):
    """``out [B, H, T, Dv]`` (``BLOCK_DV`` columns) and ``lse [B, H, T]`` (float32) of ``BLOCK_M`` query rows.

    Inputs: ``q [B, H, T, Dk]``, ``k_all [B, G, T + L, Dk]`` and ``v_all [B, G, T + L, Dv]`` (block -1 first),
    ``bias [B, H, T, 2L]``, ``codebook [G, S, Dk]``, ``log_count [B, G, N, S]`` and ``cache_mean [B, G, N, S, Dv]``
    (float32) per query block; ``has_prev``: whether block -1 holds real keys; with ``DOCS`` the document ids
    ``segment [B, (N + 1) L]`` and ``cache_segment [B, N]`` (int32, :mod:`~.tiles`).
    """
    bh = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_DV  # the first value column of this program
    m_tiles = tl.cdiv(L, BLOCK_M)
    n = tile // m_tiles
    first_row = (tile % m_tiles) * BLOCK_M
    g = (bh % H) // R  # the key/value group of this head
    bg = (bh // H) * (H // R) + g
    N = T // L
    rows_in_block = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows_in_block < L
    rows = n * L + rows_in_block
    q = load_rows(q_ptr + bh * T * Dk, rows, row_ok, Dk, 0, BLOCK_DK)
    block_segments = seg_ptr + (bh // H) * (T + L) + n * L  # the segment of window column 0
    open_rows = cache_open(block_segments, cseg_ptr + (bh // H) * N + n, rows_in_block, row_ok, L, DOCS)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    cache = bg * N + n
    for s0 in range(0, S, BLOCK_S):
        codes = s0 + tl.arange(0, BLOCK_S)
        s, _ = codeword_scores(q, cb_ptr + g * S * Dk, lc_ptr + cache * S, codes, S, Dk, open_rows,
                               BLOCK_DK, PRECISION)
        means = load_rows(cm_ptr + cache * S * Dv, codes, codes < S, Dv, d0, BLOCK_DV)
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, means, PRECISION)

    first_col = tl.where((n == 0) & (has_prev == 0), L, 0)
    window = bg * (T + L) + n * L  # row of k_all / v_all holding window column 0
    # Columns past L + the tile's last row are in every row's future: the loop stops before them.
    for j0 in range(0, L + first_row + BLOCK_M, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        visible = window_visible(rows_in_block, row_ok, cols, L, first_col, block_segments, DOCS)
        col_ok = cols < 2 * L
        k = load_rows(k_ptr + window * Dk, cols, col_ok, Dk, 0, BLOCK_DK)
        s = window_scores(q, k, bias_ptr + (bh * T + n * L) * 2 * L, rows_in_block, visible, cols, L, PRECISION)
        values = load_rows(v_ptr + window * Dv, cols, col_ok, Dv, d0, BLOCK_DV)
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, values, PRECISION)

    # Every real row sees at least its own key, so l_i > 0 there; padded rows of the tile are not stored.
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    store_rows(out_ptr + bh * T * Dv, rows, row_ok, Dv, d0, out, BLOCK_DV)
    if d0 == 0:  # one program per row stores the row's log-sum-exp
        tl.store(lse_ptr + bh * T + rows, m_i + tl.log(l_safe), mask=row_ok)
