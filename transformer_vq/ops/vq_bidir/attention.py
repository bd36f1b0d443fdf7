"""Non-causal (encoder) VQ attention in linear time: Theorems 3.4-3.5, with LongVQ's local bias (its eqs. 15-18).

Every query attends every real key of its sequence. Keys are quantized, ``k_hat[p] = C[z[p]]``, so a key seen without
a bias enters only through its code: per group and code, the count of such keys and the mean of their values
(:mod:`transformer_vq.ops.vq_bidir.summary`). Without a bias that is every key of the sequence. With the local bias,
the query block ``n`` scores the keys of blocks ``n - 1, n, n + 1`` exactly (``q . k_hat + bias``) and every other key
through the summaries of the blocks before and after that window. :mod:`transformer_vq.ops.vq_bidir.scoring` combines
the two parts by softmax or ``relu^2``. A sequence of at most two blocks lies wholly inside every query's window: it
is scored by the dense formula directly. Packed documents (``doc_start``): each query attends only its document's keys,
on both sides (:mod:`transformer_vq.ops.vq_bidir.documents`). The contract is in docs/operator.md ("Non-causal VQ
attention").

Letters: B batch, H query heads, G key/value groups, R = H // G heads per group, T tokens, N blocks, L block length,
S codewords, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.full.naive import per_head
from transformer_vq.ops.protocol import check_bias, check_documents, check_mask, check_qkv
from transformer_vq.ops.vq.attention import check_code_scores, check_codes
from transformer_vq.ops.vq.cache import log_counts
from transformer_vq.ops.vq_bidir.corrected_softmax import CorrectedSoftmax
from transformer_vq.ops.vq_bidir.documents import RowDocuments
from transformer_vq.ops.vq_bidir.naive import dense_attention
from transformer_vq.ops.vq_bidir.scoring import SCORINGS, combine, combine_corrected
from transformer_vq.ops.vq_bidir.summary import masked_summary

WINDOW_BLOCKS = 3
"""Blocks of the local-bias window: the query's own block and one on each side."""

CORRECTION_LIMIT = 4.0
"""The most negative window bias for which the window is a correction of the one summary (``combine_corrected``):
there a window key's weight through its code is removed again in part, and a sum that loses all but ``e^bias`` of a
dominant term keeps its rounding, so the result's relative error grows up to ``e^-bias`` times the dtype's epsilon
(float32, sharp queries, bias -30: 80% measured). Below it a call takes the per-block summaries, which only add: a
sequence read as one packed document."""


def vq_bidir_attention(
    q: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_len: int,
    state: None = None,
    z: torch.Tensor,
    codebook: torch.Tensor,
    mask: torch.Tensor | None = None,
    scoring: str = "softmax",
    code_scores: torch.Tensor | None = None,
    doc_start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """Attention of every query over every real key of its sequence, in time and memory linear in ``T``.

    Args:
        q: ``[B, H, T, Dk]`` queries.
        k_hat: ``[B, G, T, Dk]`` quantized keys, equal in value to ``codebook[g, z]``.
        v: ``[B, G, T, Dv]`` values.
        bias: ``None`` (every key through its code) or ``[B, H, T, 3L]``: the bias of each query to the keys of its
            three-block window; column ``j`` is the key at position ``(n - 1) L + j`` for a query in block ``n``.
        block_len: ``L``, the block length of the window.
        state: must be ``None``: a non-causal call reads whole sequences and carries nothing to a next call.
        z: ``[B, G, T]`` int64 shortcodes, ``0 <= z < S``.
        codebook: ``[G, S, Dk]`` codewords (treated as constants: no gradient flows to them).
        mask: ``[B, T]`` bool, False for padding (keys that take no part, queries whose output is zero); ``None``: all
            real.
        scoring: ``"softmax"`` or ``"relu2"`` (weight ``relu(score)^2`` over the number of real keys).
        code_scores: ``[B, H, T, S]`` scores of each query against each codeword; ``None``: ``q @ codebook^T``.
        doc_start: ``[B, T]`` bool, True where a packed document begins (:mod:`transformer_vq.ops.documents`): each
            query attends the real keys of its own document only, and ``relu2`` divides by their number.

    Returns:
        ``(out, None)``: ``out`` is ``[B, H, T, Dv]``, zero at padding queries.
    """
    _check_bidir_inputs(q, k_hat, v, bias, block_len, state, z, codebook, mask, scoring, code_scores)
    B, H, T, _ = q.shape
    check_documents(q, doc_start)
    real = torch.ones(B, T, dtype=torch.bool, device=q.device) if mask is None else mask
    # A sequence with no real key has only padding queries, whose outputs are zeroed: attending its keys as if they
    # were real keeps every score set non-empty, so neither the output nor a gradient turns NaN.
    keys_real = real | ~real.any(dim=-1, keepdim=True)
    if bias is not None and doc_start is None and T <= 2 * block_len:
        out = _attend_short(q, k_hat, v, bias, block_len, keys_real, scoring)
        return _zero_padding(out, mask).to(q.dtype), None
    if bias is None and doc_start is None:
        scores = codeword_scores(q, codebook) if code_scores is None else code_scores
        out = _attend_codes(scores, z, v, keys_real, codebook.shape[1], scoring)
    elif doc_start is None and float(bias.detach().min()) < -CORRECTION_LIMIT:  # the sequence as one document
        one_document = F.pad(torch.ones(B, 1, dtype=torch.bool, device=q.device), (0, T - 1), value=False)
        out = _attend_window(q, k_hat, v, bias, block_len, z, codebook, code_scores, keys_real, scoring, one_document)
    else:
        out = _attend_window(q, k_hat, v, bias, block_len, z, codebook, code_scores,
                             real if doc_start is not None else keys_real, scoring, doc_start)
    return _zero_padding(out, mask).to(q.dtype), None


def _zero_padding(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``out [B, H, T, Dv]`` with the rows of padding queries zeroed (``mask`` None: there are none). Filled whatever
    the mask holds: asking whether it holds any padding would read it on the host, a device sync per call."""
    return out if mask is None else out.masked_fill(~mask[:, None, :, None], 0.0)


def codeword_scores(q: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """``q . C[s]`` of every query against every codeword of its group: ``[B, H, T, S]`` (no gradient to ``C``)."""
    B, H, T, Dk = q.shape
    G, S, _ = codebook.shape
    # One (R T, Dk) x (Dk, S) product per group: the heads of a group share its codebook.
    scores = q.reshape(B, G, (H // G) * T, Dk) @ codebook.detach().transpose(-1, -2).unsqueeze(0)
    return scores.view(B, H, T, S)


def _attend_codes(code_scores, z, v, real, n_code, scoring):
    """No bias: every key through its code, Theorem 3.4 / 3.5 exactly. O(T S (Dk + Dv))."""
    B, H, T, S = code_scores.shape
    G = z.shape[1]
    count, mean = masked_summary(z, v, real, n_code)  # (B, G, S), (B, G, S, Dv)
    n_real = real.sum(dim=-1).view(B, 1, 1, 1, 1)
    out = combine(scoring, code_scores.view(B, G, H // G, T, S), [(count[:, :, None, None], mean[:, :, None])],
                  None, n_real)  # (B, G, R, T, Dv)
    return out.reshape(B, H, T, -1)


def _attend_short(q, k_hat, v, bias, L, real, scoring):
    """``T <= 2L``: the window of every query (blocks ``n - 1 .. n + 1``) covers the whole sequence, so no key is
    seen through a summary and the dense formula is this same attention, outputs and gradients; at such lengths it
    is also the cheaper one (one ``[T, T]`` product, no unfolded windows, codeword scores or summaries).
    O(T^2 (Dk + Dv))."""
    B, H, T, _ = q.shape
    position = torch.arange(T, device=q.device)
    column = position[None, :] - (position[:, None] // L - 1) * L  # (T, T): key p's window column for query t
    scores = q @ per_head(k_hat, H).transpose(-1, -2) + bias.gather(-1, column.expand(B, H, T, T))  # (B, H, T, T)
    return dense_attention(scores, v, None, block_len=L, mask=real, scoring=scoring)


def _attend_window(q, k_hat, v, bias, L, z, codebook, code_scores, real, scoring, doc_start=None):
    """The window scored exactly, every other key through its code.

    The window of query block ``n`` is the contiguous run of keys ``[(n - 1) L, (n + 2) L)`` of the keys padded by one
    empty block on each side, so its scores are one matmul against an overlapping (unfolded) view laid out column for
    column like ``bias``. Without documents every key of the sequence is read through one summary and the window's
    keys are corrected to their exact weight (:func:`~transformer_vq.ops.vq_bidir.scoring.combine_corrected`).
    O(T (S + 3L)(Dk + Dv)). ``code_scores``: the caller's (never written to), or ``None``: made here, from the
    queries padded to whole blocks, and overwritten as scratch space. With ``doc_start`` the summaries are the
    query's document's before and after the window (:class:`RowDocuments`), and without a bias the window is the
    query's own block scored through the codes (so that ``k_hat`` gets no gradient, as without documents).
    """
    B, H, T, Dk = q.shape
    G, Dv = k_hat.shape[1], v.shape[-1]
    R, N = H // G, -(-T // L)
    n_code = codebook.shape[1]
    pad = N * L - T  # padding up to whole blocks: keys that do not count, rows that are cut off
    scratch = code_scores is None or pad > 0  # scores made here (or a padded copy) may be overwritten
    if pad:
        q, k_hat, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k_hat, v))
        code_scores = None if code_scores is None else F.pad(code_scores, (0, 0, 0, pad))
        bias = None if bias is None else F.pad(bias, (0, 0, 0, pad))
        z, real = F.pad(z, (0, pad)), F.pad(real, (0, pad), value=False)
        doc_start = None if doc_start is None else F.pad(doc_start, (0, pad), value=False)
    if doc_start is None and code_scores is None and _recomputes(scoring, q, k_hat, v, bias):
        out = _attend_recomputed(q, k_hat, v, bias, L, z, codebook, real)  # (B, G, N, R, L, Dv)
        return out.transpose(2, 3).reshape(B, H, N * L, Dv)[:, :, :T]
    code_scores = codeword_scores(q, codebook) if code_scores is None else code_scores
    s_code = code_scores.view(B, G, R, N, L, -1).transpose(2, 3)  # (B, G, N, R, L, S)

    if bias is None:  # only with documents: the query's block, each key scored through its code
        s_window = s_code.gather(-1, z.view(B, G, N, 1, 1, L).expand(B, G, N, R, L, L))  # (B, G, N, R, L, L)
        v_window = v.view(B, G, N, L, Dv)
    else:
        k_window = F.pad(k_hat, (0, 0, L, L)).unfold(2, 3 * L, L)  # (B, G, N, Dk, 3L): column j is key (n-1) L + j
        q_blocks = q.view(B, G, R, N, L, Dk).transpose(2, 3)  # (B, G, N, R, L, Dk)
        bias_blocks = bias.view(B, G, R, N, L, 3 * L).transpose(2, 3)  # (B, G, N, R, L, 3L)
        qk = q_blocks @ k_window.unsqueeze(3)  # (B, G, N, R, L, 3L)
        s_window = qk + bias_blocks

    if doc_start is None:  # every key through its code, the window corrected (scoring.combine_corrected)
        scores = [s_code, s_window, qk]  # handed over, not kept: each is freed as soon as its weights are made
        del code_scores, s_code, s_window, qk
        out = _attend_corrected(scores, q_blocks, k_window, z, v, real, n_code, scoring, scratch)
        return out.transpose(2, 3).reshape(B, H, N * L, Dv)[:, :, :T]
    if bias is not None:
        del qk
        v_window = F.pad(v, (0, 0, L, L)).unfold(2, 3 * L, L).transpose(-1, -2)  # (B, G, N, 3L, Dv)
    docs = RowDocuments(z, v, real, doc_start, n_code, L, reach=0 if bias is None else 1)
    hidden = docs.window_hidden()  # (B, N, L, W)
    # A summary's count is zero in the rows of another document: they take nothing from it.
    summaries = [(count[:, :, :, None, None] * open_rows[:, None, :, None, :, None], mean.unsqueeze(3))
                 for (count, mean), open_rows in ((docs.left, docs.left_open), (docs.right, docs.right_open))]
    n_real = docs.n_keys.view(B, 1, N, 1, L, 1)
    s_window = s_window.masked_fill(hidden[:, None, :, None], float("-inf"))
    out = combine(scoring, s_code, summaries, (s_window, v_window.unsqueeze(3)), n_real)  # (B, G, N, R, L, Dv)
    return out.transpose(2, 3).reshape(B, H, N * L, Dv)[:, :, :T]


def _attend_corrected(scores, q_blocks, k_window, z, v, real, n_code, scoring, scratch):
    """``[B, G, N, R, L, Dv]`` of :func:`_attend_window` without documents, from ``scores = [code scores (B, G, N, R,
    L, S), window scores (B, G, N, R, L, 3L), the same without the bias]`` (emptied), the query blocks, the unfolded
    key windows and the sequence padded to whole blocks."""
    B, G, N, R, L, _ = scores[1].shape
    hidden = ~F.pad(real, (L, L), value=False).unfold(1, 3 * L, L)[:, None, :, None, None, :]  # (B, 1, N, 1, 1, 3L)
    # The window keys' code scores q . C[z_p]: k_hat equals C[z] in value, so they are q . k_hat without the bias,
    # except that a code score gives the key no gradient: where k_hat takes one, the product again with k_hat
    # detached (a gather from the code scores is slower on a CPU).
    key_code = scores.pop()
    if torch.is_grad_enabled() and k_window.requires_grad:
        key_code = q_blocks @ k_window.detach().unsqueeze(3)  # (B, G, N, R, L, 3L)
    # in place: neither the sum's nor the product's backward needs its output
    scores[1].masked_fill_(hidden, float("-inf"))
    scores.append(key_code.masked_fill_(hidden, float("-inf")))
    del key_code
    count, mean = masked_summary(z, v, real, n_code)  # (B, G, S), (B, G, S, Dv)
    n_real = real.sum(dim=-1).view(B, 1, 1, 1, 1, 1)
    return combine_corrected(scoring, scores, count, mean, v.view(B, G, N, L, v.shape[-1]), n_real, scratch)


def _recomputes(scoring, q, k_hat, v, bias) -> bool:
    """Whether the window path takes :class:`CorrectedSoftmax` (its scores recomputed in the backward): a softmax
    under autograd, in float32 or float64 throughout (autocast's mixed dtypes take the autograd path)."""
    tracked = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k_hat, v, bias))
    return (tracked and scoring == "softmax" and q.dtype in (torch.float32, torch.float64)
            and k_hat.dtype == v.dtype == bias.dtype == q.dtype)


def _attend_recomputed(q, k_hat, v, bias, L, z, codebook, real):
    """``[B, G, N, R, L, Dv]`` of the window path without documents by :class:`CorrectedSoftmax`, from the inputs
    padded to whole blocks; the code scores are its own (``q @ C^T``)."""
    B, H, T, Dk = q.shape
    G, S, _ = codebook.shape
    R, N = H // G, T // L
    k_window = F.pad(k_hat, (0, 0, L, L)).unfold(2, 3 * L, L)  # (B, G, N, Dk, 3L)
    bias_blocks = bias.view(B, G, R, N, L, 3 * L).transpose(2, 3)  # (B, G, N, R, L, 3L)
    hidden = ~F.pad(real, (L, L), value=False).unfold(1, 3 * L, L)[:, None, :, None, None, :]  # (B, 1, N, 1, 1, 3L)
    count, mean = masked_summary(z, v, real, S)  # (B, G, S), (B, G, S, Dv)
    logits = log_counts(count, q.dtype)[:, :, None, None, None, :]
    return CorrectedSoftmax.apply(q, k_window, bias_blocks, mean, v.view(B, G, N, L, -1), codebook.detach(), logits,
                                  hidden)


def _check_bidir_inputs(q, k_hat, v, bias, block_len, state, z, codebook, mask, scoring, code_scores):
    """The shared checks of every operator, then the non-causal operator's own inputs."""
    if state is not None:
        raise ValueError("state must be None: non-causal attention reads whole sequences and carries no state")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    check_qkv(q, k_hat, v, block_len, key_name="k_hat")
    if bias is not None:
        check_bias(q, bias, block_len, window_blocks=WINDOW_BLOCKS)
    check_codes(q, k_hat, z, codebook)
    check_mask(q, mask)
    check_code_scores(q, code_scores, codebook.shape[1])
