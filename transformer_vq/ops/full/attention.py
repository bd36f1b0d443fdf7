"""The quadratic-time baseline: exact causal softmax attention over every past key, with a growing key/value cache.

This is attention with unquantized keys and the same two-block window bias as the VQ operator (``attn_type="full"``):

    out[t] = sum_{p <= tau} softmax_p( q[t] . k[p] + beta[t, p] ) v[p]

with ``beta`` the window bias (docs/operator.md; zero for keys older than the query's two-block window), the formula
of :func:`transformer_vq.ops.full.naive.full_attention_naive`. It runs through
``torch.nn.functional.scaled_dot_product_attention`` one query block at a time, so no ``T x T`` matrix is ever stored:
a block of ``L`` query rows meets the keys ``[0, tau]`` with an additive mask that is zero on the old keys, the window
bias on the last two blocks and ``-inf`` on future keys.

Decoding keeps every key and value (``KVCache``), so a call on one token costs ``O(offset)``: this is the
growing-KV-cache baseline the paper measures Transformer-VQ against.

Letters: B batch, H query heads, G key/value groups (G divides H), T positions of the call, P cached positions,
Dk key width, Dv value width, L block length, R query rows of one block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.full.state import KVCache, continue_cache
from transformer_vq.ops.protocol import check_documents, check_inputs
from transformer_vq.ops.window import row_blocks, window_bias


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int,
                   state: KVCache | None = None, doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
    """Exact causal softmax attention with the two-block window bias, through SDPA.

    Args:
        q: ``[B, H, T, Dk]`` queries, already scaled (SDPA is called with ``scale=1``).
        k: ``[B, G, T, Dk]`` keys (unquantized).
        v: ``[B, G, T, Dv]`` values.
        bias: ``[B, H, T, 2L]`` per-(query, offset) bias on the two-block window.
        block_len: ``L``.
        state: the cache returned by a previous call on the earlier part of the same sequences.
        doc_start: ``[B, T]`` bool, True where a packed document begins: a query attends only keys of its own.

    Returns:
        ``out [B, H, T, Dv]`` and the cache extended by this call's keys and values.
    """
    check_inputs(q, k, v, bias, block_len)
    check_documents(q, doc_start)
    offset = 0 if state is None else state.offset
    cache = continue_cache(state, q, k, v, doc_start)
    gqa = k.shape[1] != q.shape[1]
    outputs = []
    for start, stop, window in row_blocks(offset, q.shape[2], block_len):
        end = offset + stop  # keys [0, end) are visible to some row of this block
        q_pos = torch.arange(offset + start, end, device=q.device)
        beta, visible = window_bias(bias[:, :, start:stop], q_pos, torch.arange(window, end, device=q.device),
                                    block_len)
        mask = beta.masked_fill(~visible, float("-inf"))  # [B, H, R, end - window]
        # Keys older than the window are attended without bias: a zero prefix of the additive mask.
        mask = F.pad(mask, (window, 0))  # [B, H, R, end]
        if cache.segment is not None:  # keys of another packed document
            other = cache.segment[:, None, offset + start:end, None] != cache.segment[:, None, None, :end]
            mask = mask.masked_fill(other, float("-inf"))  # [B, 1, R, end] against [B, H, R, end]
        outputs.append(F.scaled_dot_product_attention(
            q[:, :, start:stop], cache.k[:, :, :end], cache.v[:, :, :end],
            attn_mask=mask.to(q.dtype), scale=1.0, enable_gqa=gqa,
        ))  # [B, H, R, Dv]
    return torch.cat(outputs, dim=2), cache
