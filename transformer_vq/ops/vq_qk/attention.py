"""Causal VQ attention with quantized queries as well as keys: the key-only operator fed with table scores.

With ``q_hat = C_Q[z_q]`` in value, the attention of Definition 3.1 over ``q_hat`` is the key-only operator's
(:func:`transformer_vq.ops.vq.vq_attention`) on ``q_hat``. The one thing that changes is where a query's scores
against the key codewords come from: a row of the code-pair table ``T = C_Q C_K^T`` (:mod:`.table`) instead of the
product ``q_hat @ C_K^T``. So the per-code cache, the window, the state and every reduction are the key-only
operator's, unchanged (docs/operator.md, "VQ on queries and keys").

Letters: B batch, H query heads, G key/value groups, T tokens, L block length, S_q query codewords, S_k key
codewords, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.protocol import check_inputs
from transformer_vq.ops.vq import VQAttentionState
from transformer_vq.ops.vq.attention import attend_checked, check_codes, check_vq_options
from transformer_vq.ops.vq_qk.table import check_query_codes, code_pair_table, lookup_code_scores


def vq_qk_attention(
    q_hat: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    *,
    block_len: int,
    state: VQAttentionState | None = None,
    z_q: torch.Tensor,
    codebook_q: torch.Tensor,
    z: torch.Tensor,
    codebook: torch.Tensor,
    reduction: str = "serial",
    table: torch.Tensor | None = None,
    compressive_cache: bool = True,
    doc_start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, VQAttentionState]:
    """Causal softmax attention of quantized queries over all past quantized keys, in time linear in T.

    Args:
        q_hat: ``[B, H, T, Dk]`` quantized queries, equal in value to ``codebook_q[h, z_q]``.
        k_hat, v, bias, block_len, state, z, codebook, reduction, compressive_cache, doc_start: as
            :func:`transformer_vq.ops.vq.vq_attention` (``codebook`` is ``C_K [G, S_k, Dk]``).
        z_q: ``[B, H, T]`` int64 query shortcodes, ``0 <= z_q < S_q``.
        codebook_q: ``[H, S_q, Dk]`` query codewords ``C_Q``, one codebook per head (constants: no gradient).
        table: ``code_pair_table(codebook_q, codebook)`` when the caller holds it; ``None`` computes it, at
            ``O(H S_q S_k Dk)``. Pass it when the codebooks stay the same over many calls (decoding one token at a
            time), so that a token's cost does not include the table's.

    Returns:
        ``(out, state)``: ``out [B, H, T, Dv]`` equals the key-only operator's on ``q_hat``; ``state`` is the same
        constant-size :class:`~transformer_vq.ops.vq.VQAttentionState`.

    Gradients: those of the key-only operator on ``q_hat``, ``v``, ``bias`` and ``k_hat`` (window keys only); the
    codebooks, codes and table get none.
    """
    check_vq_options(reduction, compressive_cache)
    check_inputs(q_hat, k_hat, v, bias, block_len, key_name="k_hat", query_name="q_hat")
    check_codes(q_hat, k_hat, z, codebook)
    check_query_codes(q_hat, z_q, codebook_q, codebook, table)
    if table is None:
        table = code_pair_table(codebook_q, codebook)
    code_scores = lookup_code_scores(q_hat, z_q, table, codebook)  # (B, H, T, S_k)
    # the key-only operator past the checks just made (its own would repeat them)
    return attend_checked(q_hat, k_hat, v, bias, block_len, state, z, codebook, reduction, code_scores,
                          compressive_cache, "eager", doc_start, None)
