"""The FLASH baselines by their defining formulas, query by query where that is plainer: slow and obviously right.

FLASH-Quad: ``out[t] = sum_{p <= t} relu(q[t] . k[p] / n + beta[t, p])^2 v[p]``.

FLASH (mixed chunk, chunks of ``C`` aligned to position 0): the same squared ReLU with ``n = C`` over the keys of the
query's own chunk, plus ``q[t] . (sum of k[p] v[p]^T over the keys of earlier chunks) / (their number)``.

The oracles of :mod:`transformer_vq.ops.flash` (docs/operator.md).

Letters: B batch, H query heads, G key/value groups, T positions, Dk key width, Dv value width, L block length.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.full.naive import causal_mask, per_head, same_document
from transformer_vq.ops.protocol import check_positive_int, check_reference_call
from transformer_vq.ops.window import window_bias_dense


def flash_quad_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                               block_len: int, norm_len: int | None = None,
                               doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """FLASH-Quad (``n = norm_len``, default ``block_len``), the whole ``T x T`` matrix at once; ``doc_start [B, T]``:
    each query sums over its own packed document."""
    check_reference_call(q, k, v, bias, block_len, doc_start=doc_start)
    n_head = q.shape[1]
    norm_len = block_len if norm_len is None else norm_len
    check_positive_int(norm_len, "norm_len")
    scores = q @ per_head(k, n_head).transpose(-1, -2) / norm_len + window_bias_dense(bias, block_len)
    visible = causal_mask(q.shape[2], q.device)
    if doc_start is not None:
        visible = visible & same_document(doc_start)
    return (torch.relu(scores).square() * visible) @ per_head(v, n_head)


def flash_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int,
                          chunk_len: int, doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """FLASH, query by query: squared ReLU inside the chunk + mean of ``k v^T`` over the keys of earlier chunks;
    ``doc_start [B, T]``: both over the keys of the query's own packed document."""
    check_reference_call(q, k, v, bias, block_len, doc_start=doc_start)
    check_positive_int(chunk_len, "chunk_len")
    batch, n_head, length = q.shape[:3]
    kh, vh, beta = per_head(k, n_head), per_head(v, n_head), window_bias_dense(bias, block_len)
    if doc_start is None:
        doc_start = torch.zeros(batch, length, dtype=torch.bool, device=q.device)
    segment = segment_ids(doc_start)[:, None, :, None]  # (B, 1, T, 1)
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)
    for t in range(length):
        start = t // chunk_len * chunk_len
        own = (segment == segment[:, :, t:t + 1]).to(q.dtype)  # (B, 1, T, 1): keys of the query's document
        scores = torch.einsum("bhd,bhpd->bhp", q[:, :, t], kh[:, :, start:t + 1]) / chunk_len
        scores = scores + beta[:, :, t, start:t + 1]
        out[:, :, t] = torch.einsum("bhp,bhpe->bhe", torch.relu(scores).square(), vh[:, :, start:t + 1]
                                    * own[:, :, start:t + 1])
        count = own[:, :, :start].sum(dim=(2, 3))  # (B, 1)
        kv = torch.einsum("bhpd,bhpe->bhde", kh[:, :, :start] * own[:, :, :start], vh[:, :, :start])
        out[:, :, t] += torch.einsum("bhd,bhde->bhe", q[:, :, t], kv) / count.clamp(min=1)[..., None]
    return out
