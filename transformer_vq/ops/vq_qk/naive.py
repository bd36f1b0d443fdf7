"""The dense formulas the operators with quantized queries are tested against: slow and obviously right.

Both know nothing of codes, tables or blocks: they attend ``q_hat`` to ``k_hat`` through the full ``T x T`` score
matrix.

Letters: B batch, H query heads, G key/value groups, T positions, L block length, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.full.naive import full_attention_naive, per_head
from transformer_vq.ops.protocol import check_reference_call


def vq_qk_attention_naive(q_hat: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                          block_len: int, doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum_{p <= t} softmax_p(q_hat[t] . k_hat[p] + beta[t, p]) v[p]``: Definition 3.1 on quantized
    queries, with the window bias of docs/operator.md.

    Shapes: ``q_hat [B, H, T, Dk]``, ``k_hat [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias [B, H, T, 2L]``; returns
    ``[B, H, T, Dv]``. ``doc_start [B, T]``: the sum runs over the query's own packed document.
    """
    check_reference_call(q_hat, k_hat, v, bias, block_len, key_name="k_hat", query_name="q_hat", doc_start=doc_start)
    return full_attention_naive(q_hat, k_hat, v, bias, block_len=block_len, doc_start=doc_start)


def vq_qk_attention_noncausal_naive(q_hat: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, *,
                                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum_{p real} softmax_p(q_hat[t] . k_hat[p]) v[p]`` at real ``t``, zero at padded ``t``.

    Shapes: ``q_hat [B, H, T, Dk]``, ``k_hat [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``mask [B, T]`` bool (True: real);
    returns ``[B, H, T, Dv]``.
    """
    check_reference_call(q_hat, k_hat, v, None, None, key_name="k_hat", query_name="q_hat", mask=mask)
    n_head = q_hat.shape[1]
    scores = q_hat @ per_head(k_hat, n_head).transpose(-1, -2)  # (B, H, T, T)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ per_head(v, n_head)
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ per_head(v, n_head)  # NaN rows where a sequence has no real key
    return torch.where(mask[:, None, :, None], out, torch.zeros_like(out))
