"""Two slow, obviously right forms of VQ attention: the oracles the linear-time operator is tested against.

* :func:`vq_attention_naive`: Definition 3.1 by the dense ``T x T`` formula, causal softmax attention over the
  quantized keys with the window bias. It knows nothing of codes or blocks.
* :func:`vq_attention_blockwise`: Theorem 3.7 by a plain loop over blocks. For each query block it counts the codes
  of every key older than the block's two-block window and averages their values from scratch (no merges, no
  reductions), then attends codewords and window keys with one softmax. It also returns the state the operator must
  end with, and its gradients are the operator's exactly, the truncation for keys included (docs/operator.md).

Letters: B batch, H query heads, G key/value groups, T positions, L block length, S codewords, P keys,
Dk key width, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.full.naive import full_attention_naive, per_head
from transformer_vq.ops.protocol import check_reference_call
from transformer_vq.ops.vq.state import VQAttentionState


def vq_attention_naive(q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                       block_len: int, compressive_cache: bool = True,
                       doc_start: torch.Tensor | None = None,
                       cache_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum_{p <= t} softmax_p(q[t] . k_hat[p] + beta[t, p]) v[p]``: full attention over quantized keys.

    Shapes: ``q [B, H, T, Dk]``, ``k_hat [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias [B, H, T, 2L]``; returns
    ``[B, H, T, Dv]``. ``compressive_cache`` false: the sum runs over the two-block window ``(t // L - 1) L <= p``
    only (the operator without its cache). ``doc_start [B, T]``: the sum runs over the query's own packed document.
    ``cache_bias [H]``: ``+ cache_bias[h]`` on the score of every key older than the window, ``p < (t // L - 1) L``.
    """
    check_reference_call(q, k_hat, v, bias, block_len, key_name="k_hat", doc_start=doc_start)
    if cache_bias is not None and not compressive_cache:
        raise ValueError("cache_bias applies to the keys older than the window: with compressive_cache=False "
                         "there are none; pass cache_bias=None")
    return full_attention_naive(q, k_hat, v, bias, block_len=block_len, window_only=not compressive_cache,
                                doc_start=doc_start, older_bias=cache_bias)


def vq_attention_blockwise(q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                           block_len: int, z: torch.Tensor, codebook: torch.Tensor,
                           doc_start: torch.Tensor | None = None,
                           cache_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, VQAttentionState]:
    """Block by block: the per-code cache of every older key, then one softmax over codewords and window keys.

    Shapes as :func:`transformer_vq.ops.vq.vq_attention`; returns ``out [B, H, T, Dv]`` and the state after ``T``
    positions. ``doc_start [B, T]``: each query counts and attends only the keys of its own packed document.
    ``cache_bias [H]``: added to every codeword's score (each stands for keys older than the window).
    """
    older_bias = 0.0 if cache_bias is None else cache_bias[None, :, None]  # (1, H, 1)
    B, n_head, length = q.shape[:3]
    n_code, L = codebook.shape[1], block_len
    keys, values, codes = per_head(k_hat, n_head), per_head(v, n_head), per_head(z, n_head)  # one per query head
    codewords = per_head(codebook.detach().unsqueeze(0), n_head)  # (1, H, S, Dk): constants, no gradient
    if doc_start is None:
        doc_start = torch.zeros(B, length, dtype=torch.bool, device=q.device)
    segment = segment_ids(doc_start)[:, None, :]  # (B, 1, T)
    rows = []
    for n in range(-(-length // L)):
        window = (n - 1) * L  # w: the first position of the block's two-block window
        first = max(window, 0)
        for t in range(n * L, min((n + 1) * L, length)):
            own = segment == segment[:, :, t:t + 1]  # (B, 1, T): keys of the query's document
            count, mean = _plain_summary(codes[:, :, :first], values[:, :, :first], n_code, own[:, :, :first])
            # (B, H, S); log 0 = -inf
            s_cache = (codewords @ q[:, :, t, :, None]).squeeze(-1) + count.log() + older_bias
            s_window = (keys[:, :, first:t + 1] @ q[:, :, t, :, None]).squeeze(-1)  # (B, H, t + 1 - first)
            s_window = s_window + bias[:, :, t, first - window:t + 1 - window]
            s_window = s_window.masked_fill(~own[:, :, first:t + 1], float("-inf"))
            weights = torch.softmax(torch.cat([s_cache, s_window], dim=-1), dim=-1)
            rows.append((weights[..., None, :n_code] @ mean).squeeze(-2)
                        + (weights[..., None, n_code:] @ values[:, :, first:t + 1]).squeeze(-2))
    # After T positions the next query is in block T // L: keys before its window are summarized, the rest kept.
    # The state's cache holds the keys of the document of the last summarized key.
    kept = max((length // L - 1) * L, 0)
    own = segment == segment[:, :, max(kept - 1, 0):max(kept, 1)]
    count, mean = _plain_summary(z[:, :, :kept], v[:, :, :kept], n_code, own[:, :, :kept])
    state = VQAttentionState(length, count.float(), mean.to(torch.promote_types(v.dtype, torch.float32)),
                             k_hat[:, :, kept:], v[:, :, kept:], z[:, :, kept:], doc_start[:, kept:], L,
                             documents=bool(doc_start.any()))
    return torch.stack(rows, dim=2), state


def _plain_summary(codes: torch.Tensor, values: torch.Tensor, n_code: int,
                   counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Number of keys per code and the mean of their values (0 for unused codes), over the keys ``counted``.

    Shapes: ``codes [B, *, P]``, ``values [B, *, P, Dv]``, ``counted [B, 1, P]`` bool; returns ``[B, *, S]`` and
    ``[B, *, S, Dv]``.
    """
    one_hot = F.one_hot(codes, n_code).to(values.dtype) * counted.unsqueeze(-1)  # (B, *, P, S)
    count = one_hot.sum(dim=-2)
    return count, (one_hot.transpose(-1, -2) @ values) / count.clamp(min=1.0).unsqueeze(-1)
