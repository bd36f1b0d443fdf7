"""The dense O(T^2) VQ-attention formula, written to be obviously right.

Tensor letters: B batch, H query heads, G key/value groups (H % G == 0), T sequence length,
L block length, Dk key width, Dv value width.

This is the test oracle for :func:`transformer_vq.ops.vq_attention`: it materializes the full
``[T, T]`` score matrix of Definition 3.1 with the bias of the SPEC (window bias on the query's own
block and the block before it, zero bias on every older key, causal mask) and applies a plain softmax.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.window_bias import window_bias


def window_bias_matrix(bias: torch.Tensor, block_len: int, offset: int = 0) -> torch.Tensor:
    """Expand the per-(query, offset) window bias into the dense ``[.., T, T]`` bias ``beta`` of the SPEC.

    Args:
        bias: ``[B, H, T, 2L]``; ``bias[..., t, j]`` is the bias of query ``t`` to the key at position
            ``w(t) + j`` where ``w(t) = (t // L - 1) * L`` is the start of the query's two-block window.
        block_len: ``L``.
        offset: absolute position of query row 0 (keys are assumed to start at the same position).

    Returns:
        ``[B, H, T, T]`` with ``beta[..., t, p] = bias[..., t, p - w(t)]`` inside the window and ``0``
        outside it and for future keys (the causal mask itself is applied by the caller).
    """
    pos = torch.arange(bias.shape[-2], device=bias.device) + offset
    return window_bias(bias, pos, pos, block_len)[0]


def vq_attention_reference(
    q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int
) -> torch.Tensor:
    """Causal softmax attention with the window bias, by the dense formula (SPEC, Definition 3.1).

    Args:
        q: ``[B, H, T, Dk]`` queries.
        k_hat: ``[B, G, T, Dk]`` (quantized) keys.
        v: ``[B, G, T, Dv]`` values.
        bias: ``[B, H, T, 2L]`` window bias.
        block_len: ``L``.

    Returns:
        ``[B, H, T, Dv]``: ``out[t] = sum_{p <= t} softmax_p(q_t . k_p + beta[t, p]) v_p``.
    """
    B, H, T, _ = q.shape
    G = k_hat.shape[1]
    if H % G != 0:
        raise ValueError(f"number of query heads H={H} must be a multiple of key/value groups G={G}")
    k_rep = k_hat.repeat_interleave(H // G, dim=1)  # (B, H, T, Dk): head h reads group h // (H // G)
    v_rep = v.repeat_interleave(H // G, dim=1)  # (B, H, T, Dv)
    scores = q @ k_rep.transpose(-1, -2) + window_bias_matrix(bias, block_len)  # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v_rep
