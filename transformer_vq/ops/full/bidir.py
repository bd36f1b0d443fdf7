"""The non-causal quadratic baseline: softmax attention of every query over every real key, unquantized keys.

    out[t] = sum_{p real} softmax_p( q[t] . k[p] + beta[t, p] ) v[p]          (zero at padding queries)

with ``beta`` the three-block local bias of the non-causal VQ operator (docs/operator.md, "Non-causal VQ attention":
the window of a query in block ``n`` is ``[(n - 1) L, (n + 2) L)``, key ``p`` takes column ``p - (n - 1) L``). This is
``attn_type="full"`` with ``causal=False``: the encoder the non-causal VQ operator is compared with. Its scores are
built whole (``T x T`` per head), as a baseline's may be; its oracle is the position-by-position formula
:func:`transformer_vq.ops.vq_bidir.vq_bidir_attention_naive` on unquantized keys.

Letters: B batch, H query heads, G key/value groups (G divides H), T positions, L block length.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.full.naive import per_head
from transformer_vq.ops.protocol import check_bias, check_documents, check_mask, check_qkv


def full_bidir_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None, *,
                         block_len: int, state: None = None,
                         mask: torch.Tensor | None = None,
                         doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
    """Exact non-causal softmax attention; ``bias`` ``None`` or ``[B, H, T, 3L]``, ``mask [B, T]`` (True: real),
    ``doc_start [B, T]`` (packed documents: a query attends the keys of its own document only).

    Returns ``(out [B, H, T, Dv], None)``: a non-causal call reads whole sequences and carries no state.
    """
    check_qkv(q, k, v, block_len, key_name="k")
    if state is not None:
        raise ValueError("non-causal attention reads whole sequences and carries no state: pass state=None")
    if bias is not None:
        check_bias(q, bias, block_len, window_blocks=3)
    check_mask(q, mask)
    check_documents(q, doc_start)
    B, H, T, _ = q.shape
    scores = q @ per_head(k, H).transpose(-1, -2)  # (B, H, T, T)
    if bias is not None:
        positions = torch.arange(T, device=q.device)
        column = positions[None, :] - (positions[:, None] // block_len - 1) * block_len  # (T, T)
        in_window = (column >= 0) & (column < 3 * block_len)
        beta = torch.gather(bias, -1, column.clamp(0, 3 * block_len - 1).expand(B, H, T, T))
        scores = scores + beta.masked_fill(~in_window, 0.0)
    # A query attends the real keys of its sequence (its document, packed); one that has none (a padding query,
    # zeroed below) attends all of them, so that no row is all -inf.
    visible = torch.ones(B, 1, 1, T, dtype=torch.bool, device=q.device) if mask is None else mask[:, None, None, :]
    if doc_start is not None:
        segment = segment_ids(doc_start)
        same = segment[:, None, :, None] == segment[:, None, None, :]  # (B, 1, T, T)
        visible = same & (visible | ~(visible & same).any(dim=-1, keepdim=True))
    elif mask is not None:
        visible = visible | ~visible.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ per_head(v, H)
    if mask is not None:
        out = out.masked_fill(~mask[:, None, :, None], 0.0)
    return out, None
