"""Causal softmax attention with the window bias by the dense ``T x T`` formula: slow and obviously right.

    out[t] = sum_{p <= t} softmax_p( q[t] . k[p] + beta[t, p] ) v[p]

This is the oracle of ``full_attention`` and, applied to quantized keys, Definition 3.1, the formula the VQ operator
must equal (docs/operator.md).

Letters: B batch, H query heads, G key/value groups (G divides H), T positions, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.protocol import check_reference_call
from transformer_vq.ops.window import window_bias_dense


def per_head(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """The tensor of group ``h // (H // G)`` for every query head ``h``: ``[B, G, T, ...] -> [B, H, T, ...]``."""
    return x.repeat_interleave(n_head // x.shape[1], dim=1)


def causal_mask(length: int, device=None) -> torch.Tensor:
    """``[T, T]`` True where key ``p`` is visible to query ``t`` (``p <= t``)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def window_mask(length: int, block_len: int, device=None) -> torch.Tensor:
    """``[T, T]`` True where key ``p`` lies in query ``t``'s two-block window: ``(t // L - 1) L <= p <= t``."""
    t = torch.arange(length, device=device)
    return causal_mask(length, device) & (t[None, :] >= (t[:, None] // block_len - 1) * block_len)


def same_document(doc_start: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` True where key ``p`` and query ``t`` belong to one packed document (``doc_start [B, T]``)."""
    segment = segment_ids(doc_start)
    return (segment[:, :, None] == segment[:, None, :]).unsqueeze(1)


def full_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                         block_len: int, window_only: bool = False,
                         doc_start: torch.Tensor | None = None,
                         older_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T, Dv]`` from ``q [B, H, T, Dk]``, ``k [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias [B, H, T, 2L]``.

    ``window_only``: each query attends the keys of its two-block window alone (:func:`window_mask`).
    ``doc_start``: ``[B, T]`` bool, where packed documents begin; a query attends only keys of its own.
    ``older_bias``: ``[H]``, added to the score of every key older than the query's two-block window (head ``h``
    adds ``older_bias[h]``): the VQ operator's ``cache_bias`` in the dense formula.
    """
    check_reference_call(q, k, v, bias, block_len, doc_start=doc_start)
    weights = attention_weights(q, k, bias, block_len=block_len, window_only=window_only, doc_start=doc_start,
                                older_bias=older_bias)
    return weights @ per_head(v, q.shape[1])


def attention_weights(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, *, block_len: int,
                      window_only: bool = False, doc_start: torch.Tensor | None = None,
                      older_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T, T]`` the softmax weights of :func:`full_attention_naive` (its arguments, ``v`` left out): row
    ``t`` is query ``t``'s distribution over the keys ``p <= t`` it may attend."""
    n_head, length = q.shape[1], q.shape[2]
    scores = q @ per_head(k, n_head).transpose(-1, -2) + window_bias_dense(bias, block_len)  # (B, H, T, T)
    if older_bias is not None:
        older = ~window_mask(length, block_len, q.device)  # (T, T): keys before the window (and future ones, masked)
        scores = scores + older_bias.to(scores.dtype)[:, None, None] * older
    visible = window_mask(length, block_len, q.device) if window_only else causal_mask(length, q.device)
    if doc_start is not None:
        visible = visible & same_document(doc_start)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
