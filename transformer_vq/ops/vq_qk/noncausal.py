"""Non-causal VQ attention with quantized queries and keys: one output row per query code.

Every query attends every real key of its sequence, with no window. Keys enter only through their code (Theorem 3.5
with quantized keys): per key code ``s`` the count ``N[s]`` of real keys and the mean ``m[s]`` of their values. With
quantized queries the scores of a query depend on its code alone, ``T[z_q[t]] + log N``, so so does its output:

    row[c] = softmax_s(T[c, s] + log N[s]) @ m,      out[t] = row[z_q[t]]

``S_q`` rows of ``[S_q, S_k] @ [S_k, Dv]`` work are computed once, then gathered: ``O(T Dv + S_q S_k Dv)`` in all,
a per-token cost independent of ``T`` and of ``Dk`` (docs/operator.md, "VQ on queries and keys").

Gradients: ``v`` through the counts and means. ``q_hat`` gets the straight-through gradient of the scores
``q_hat @ C_K^T``: the per-code form above has no path to ``q_hat``, so when ``q_hat`` needs a gradient the same
softmax is taken per token over the looked-up rows ``T[z_q[t]]`` (:func:`~.table.lookup_code_scores`), at
``O(T S_k Dv)``. The codebooks, codes and table get no gradient, nor does ``k_hat`` (every key is attended through
its code, as keys outside the window are in the causal operator).

Letters: B batch, H query heads, G key/value groups, R = H // G, T tokens, S_q query codewords, S_k key
codewords, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.protocol import check_mask, check_qkv
from transformer_vq.ops.vq.attention import check_codes
from transformer_vq.ops.vq.cache import log_counts, summarize
from transformer_vq.ops.vq.kernels import softmax_combine
from transformer_vq.ops.vq_qk.table import check_query_codes, code_pair_table, lookup_code_scores


def vq_qk_attention_noncausal(q_hat: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, *, z_q: torch.Tensor,
                              codebook_q: torch.Tensor, z: torch.Tensor, codebook: torch.Tensor,
                              mask: torch.Tensor | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
    """Bidirectional softmax attention of quantized queries over every real quantized key of the sequence.

    Args:
        q_hat: ``[B, H, T, Dk]`` quantized queries, equal in value to ``codebook_q[h, z_q]``.
        k_hat: ``[B, G, T, Dk]`` quantized keys, equal in value to ``codebook[g, z]``.
        v: ``[B, G, T, Dv]`` values.
        z_q, codebook_q, z, codebook, table: as :func:`transformer_vq.ops.vq_qk.vq_qk_attention`.
        mask: ``[B, T]`` bool, True at real tokens (``None``: all real). Padded keys take no part; the outputs at
            padded queries are zero.

    Returns:
        ``out [B, H, T, Dv]``. There is no state: a non-causal call sees its whole sequences.
    """
    check_qkv(q_hat, k_hat, v, None, key_name="k_hat", query_name="q_hat")
    check_mask(q_hat, mask)
    check_codes(q_hat, k_hat, z, codebook)
    check_query_codes(q_hat, z_q, codebook_q, codebook, table)
    B, H, T, _ = q_hat.shape
    G, S_k, _ = codebook.shape
    R, S_q, Dv = H // G, codebook_q.shape[1], v.shape[-1]
    if table is None:
        table = code_pair_table(codebook_q, codebook)

    # Padded keys go to an extra code S_k, dropped afterwards: the summaries then count real keys only.
    codes = z if mask is None else torch.where(mask[:, None, :], z, S_k)
    count, mean = summarize(codes, v, S_k + 1, torch.promote_types(v.dtype, torch.float32))
    count, mean = count[..., :S_k], mean[..., :S_k, :]  # (B, G, S_k), (B, G, S_k, Dv)
    log_n = log_counts(count, table.dtype)
    # A sequence with no real key has only padded queries, whose outputs are zeroed: any finite scores will do.
    log_n = torch.where((count > 0).any(dim=-1, keepdim=True), log_n, torch.zeros_like(log_n))[:, :, None, None, :]

    if torch.is_grad_enabled() and q_hat.requires_grad:
        scores = lookup_code_scores(q_hat, z_q, table, codebook).view(B, G, R, T, S_k)
        out = softmax_combine([(scores + log_n, mean[:, :, None])]).reshape(B, H, T, Dv)
    else:
        scores = table.view(G, R, S_q, S_k).unsqueeze(0)  # (1, G, R, S_q, S_k): the same rows for every sequence
        rows = softmax_combine([(scores + log_n, mean[:, :, None])]).reshape(B, H, S_q, Dv)
        out = rows.gather(2, z_q.unsqueeze(-1).expand(B, H, T, Dv))  # row z_q[t] for token t
    out = out.to(q_hat.dtype)
    return out if mask is None else out.masked_fill(~mask[:, None, :, None], 0.0)
