"""Triton device functions shared by the forward and backward kernels: loading tiles and scoring them.

A query block ``n`` (rows ``n L .. n L + L - 1`` of the call) attends two sets of keys (docs/operator.md):

* the codewords of its group, each with the additive term ``log c[s]`` of the block's cache (``-inf`` for unused
  codes, so they get zero weight), and the cache means as values;
* its two-block window, columns ``j = 0 .. 2L - 1`` of ``k_all`` from position ``n L`` (``k_all`` starts with block
  ``-1``), with the window bias ``bias[row, j]``; column ``j`` is visible to row ``i`` of the block iff
  ``j <= L + i`` (causal) and ``j >= first_col`` (``L`` when block ``-1`` does not exist, else 0).

Packed documents (``DOCS``): ``segment [B, (N + 1) L]`` int32 numbers the documents of the positions of ``k_all`` and
``cache_segment [B, N]`` is the document the cache of each query block summarizes (that of the key before its window).
A window column is visible only when its segment is the row's, and the codewords only when the cache's segment is the
row's (the masks of :class:`transformer_vq.ops.vq.kernels.BlockDocuments`, computed here from the ids, not stored).

Every tensor is contiguous; a tile is addressed by a base pointer, row indices and the row width.
Letters: M query rows of a tile, N keys of a tile, DK / DV padded key and value widths.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, idx, ok, width, first, BLOCK_D: tl.constexpr):
    """``(len(idx), BLOCK_D)`` tile of columns ``first ..`` of a row-major matrix of ``width`` columns; zeros
    outside ``ok`` and past the width."""
    cols = first + tl.arange(0, BLOCK_D)
    return tl.load(ptr + idx[:, None] * width + cols[None, :], mask=ok[:, None] & (cols[None, :] < width), other=0.0)


@triton.jit
def store_rows(ptr, idx, ok, width, first, tile, BLOCK_D: tl.constexpr):
    """Store ``tile`` at columns ``first ..`` of rows ``idx`` (where ``ok``) of a matrix of ``width`` columns."""
    cols = first + tl.arange(0, BLOCK_D)
    tl.store(ptr + idx[:, None] * width + cols[None, :], tile.to(ptr.dtype.element_ty),
             mask=ok[:, None] & (cols[None, :] < width))


@triton.jit
def value_products(do_ptr, rows, row_ok, v_ptr, idx, ok, Dv, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """``(M, N)`` products ``dp = dO[rows] . v[idx]`` over the whole value width, ``BLOCK_DV`` columns at a time (so
    that no program holds a whole wide value row)."""
    dp = tl.zeros((rows.shape[0], idx.shape[0]), tl.float32)
    for d0 in range(0, Dv, BLOCK_DV):
        v = load_rows(v_ptr, idx, ok, Dv, d0, BLOCK_DV)
        do = load_rows(do_ptr, rows, row_ok, Dv, d0, BLOCK_DV)
        dp += tl.dot(do.to(v.dtype), tl.trans(v), input_precision=PRECISION)
    return dp


@triton.jit
def codeword_scores(q, cb_ptr, lc_ptr, codes, S, Dk, open_rows, BLOCK_DK: tl.constexpr, PRECISION: tl.constexpr):
    """``(M, N)`` scores ``q . C[s] + log c[s]`` of a tile of codes, ``-inf`` past ``S`` and in rows not
    ``open_rows`` (:func:`cache_open`); and the codewords."""
    ok = codes < S
    c = load_rows(cb_ptr, codes, ok, Dk, 0, BLOCK_DK)
    lc = tl.load(lc_ptr + codes, mask=ok, other=float("-inf"))
    s = tl.dot(q, tl.trans(c), input_precision=PRECISION) + lc[None, :]
    return tl.where(open_rows[:, None], s, float("-inf")), c


@triton.jit
def cache_open(seg_ptr, cseg_ptr, rows_in_block, row_ok, L, DOCS: tl.constexpr):
    """``(M,)`` True where row ``rows_in_block`` of a query block sees the block's cache: a real row, of the
    document the cache summarizes (``DOCS``). ``seg_ptr`` points at the segment of the block's window column 0,
    ``cseg_ptr`` at the block's cache segment."""
    open_rows = row_ok
    if DOCS:
        row_segment = tl.load(seg_ptr + L + rows_in_block, mask=row_ok, other=-1)
        open_rows = open_rows & (row_segment == tl.load(cseg_ptr))
    return open_rows


@triton.jit
def window_visible(rows_in_block, row_ok, cols, L, first_col, seg_ptr, DOCS: tl.constexpr):
    """``(M, N)`` True where window column ``cols`` is a visible key of row ``rows_in_block`` of its block: causal,
    real, and (``DOCS``) of the row's document; ``seg_ptr`` points at the segment of window column 0."""
    col_ok = (cols < 2 * L) & (cols >= first_col)
    visible = row_ok[:, None] & col_ok[None, :] & (cols[None, :] <= L + rows_in_block[:, None])
    if DOCS:
        row_segment = tl.load(seg_ptr + L + rows_in_block, mask=row_ok, other=-1)
        col_segment = tl.load(seg_ptr + cols, mask=col_ok, other=-2)
        visible = visible & (row_segment[:, None] == col_segment[None, :])
    return visible


@triton.jit
def window_scores(q, k, bias_ptr, rows_in_block, visible, cols, L, PRECISION: tl.constexpr):
    """``(M, N)`` scores ``q . k + bias[row, col]`` of window keys ``k``, ``-inf`` where not visible.

    ``bias_ptr`` points at the bias row of the block's first query.
    """
    b = tl.load(bias_ptr + rows_in_block[:, None] * (2 * L) + cols[None, :], mask=visible, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) + b.to(tl.float32)
    return tl.where(visible, s, float("-inf"))


@triton.jit
def online_softmax_step(m_i, l_i, acc, s, values, PRECISION: tl.constexpr):
    """One tile of the online softmax: rescale the running sums to the new running max, add the tile's share.

    A row whose scores are all ``-inf`` so far (no used code yet) keeps a zero sum: the max is then taken as 0
    for the exponentials, so no ``-inf - -inf`` appears.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
    return m_new, l_i, acc
