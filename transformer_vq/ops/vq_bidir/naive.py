"""Non-causal VQ attention by the dense ``T x T`` formula: the oracle of the linear-time operator.

    softmax:  out[t] = sum_{p real} softmax_p( q[t] . k_hat[p] + beta[t, p] ) v[p]
    relu2:    out[t] = sum_{p real} relu( q[t] . k_hat[p] + beta[t, p] )^2 v[p] / n_real

with ``beta`` the three-block window bias (zero for keys outside the window, or everywhere without a bias), and
``out[t] = 0`` at padding queries. With packed documents (``doc_start``) the sums run over the real keys of the
query's document and ``n_real`` counts them; the bias stays that of the row's block grid. It knows nothing of codes,
blocks or summaries.

Letters: B batch, H query heads, G key/value groups, T positions, L block length, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.full.naive import per_head
from transformer_vq.ops.protocol import check_reference_call


def vq_bidir_attention_naive(q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                             *, block_len: int, mask: torch.Tensor | None = None,
                             scoring: str = "softmax", doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T, Dv]`` from ``q [B, H, T, Dk]``, ``k_hat [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias`` ``None``
    or ``[B, H, T, 3L]``, ``mask [B, T]`` (``None``: all real); ``scoring`` ``"softmax"`` or ``"relu2"``;
    ``doc_start [B, T]`` (``None``: one document per row)."""
    check_reference_call(q, k_hat, v, bias, block_len, key_name="k_hat", window_blocks=3, mask=mask,
                         doc_start=doc_start)
    scores = q @ per_head(k_hat, q.shape[1]).transpose(-1, -2)  # (B, H, T, T)
    return dense_attention(scores, v, bias, block_len=block_len, mask=mask, scoring=scoring, doc_start=doc_start)


def dense_attention(scores: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, *, block_len: int,
                    mask: torch.Tensor | None, scoring: str, doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """The formula above from the query-key scores ``[B, H, T, T]`` (without the bias)."""
    B, H, T, _ = scores.shape
    if bias is not None:
        scores = scores + window_bias_bidir_dense(bias, block_len)
    real = torch.ones(B, T, dtype=torch.bool, device=scores.device) if mask is None else mask
    key_real = real[:, None, None, :]  # (B, 1, 1, T)
    if doc_start is not None:
        segment = segment_ids(doc_start)
        key_real = key_real & (segment[:, None, :, None] == segment[:, None, None, :])  # (B, 1, T, T)
    if scoring == "softmax":
        weights = torch.softmax(scores.masked_fill(~key_real, float("-inf")), dim=-1)
    else:
        n_real = key_real.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1, 1 or T, 1)
        weights = F.relu(scores).square().masked_fill(~key_real, 0.0) / n_real
    out = weights @ per_head(v, H)
    return out.masked_fill(~real[:, None, :, None], 0.0)


def window_bias_bidir_dense(bias: torch.Tensor, block_len: int) -> torch.Tensor:
    """``beta [B, H, T, T]`` from ``bias [B, H, T, 3L]``, filled in position by position.

    The query at position ``t`` in block ``n = t // L`` has the window ``[(n - 1) L, (n + 2) L)``; key ``p`` in it
    takes column ``p - (n - 1) L``. Keys outside the window, and columns outside ``[0, T)``, take nothing.
    """
    batch, n_head, length, _ = bias.shape
    beta = torch.zeros(batch, n_head, length, length, dtype=bias.dtype, device=bias.device)
    for t in range(length):
        window = (t // block_len - 1) * block_len
        first, last = max(window, 0), min(window + 3 * block_len, length)
        beta[:, :, t, first:last] = bias[:, :, t, first - window:last - window]
    return beta
