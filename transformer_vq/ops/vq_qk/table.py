"""The table of code-pair scores, and a quantized query's scores against the key codebook read from it.

With queries quantized as well as keys, ``q_hat[t] = C_Q[z_q[t]]`` in value, so the score of a query against key
codeword ``s`` is ``q_hat[t] . C_K[s] = T[z_q[t], s]`` with ``T = C_Q C_K^T``: one table per head, computed once
per call (or once while the codebooks stay the same), after which a query's ``S_k`` scores cost a row copy and no
``Dk`` work (docs/operator.md, "VQ on queries and keys").

* :func:`code_pair_table`: ``T [H, S_q, S_k]``;
* :func:`lookup_code_scores`: the rows of ``T`` picked by the query codes, differentiable in ``q_hat`` (the
  straight-through gradient ``grad @ C_K``, exactly that of ``q_hat @ C_K^T``); the codebooks get no gradient;
* :func:`check_query_codes`: the checks of the query side's inputs.

Letters: B batch, H query heads, G key/value groups, R = H // G, T tokens, S_q query codewords, S_k key codewords,
Dk key width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.protocol import check_code_range, check_devices, check_floating, check_is_tensor, check_like


def code_pair_table(codebook_q: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """``T[h] = C_Q[h] C_K[h // R]^T``: ``[H, S_q, S_k]`` from ``codebook_q [H, S_q, Dk]``, ``codebook [G, S_k, Dk]``.

    Both codebooks are constants to the operator (they are learned by EMA), so the table is detached.
    """
    H, S_q, Dk = codebook_q.shape
    G, S_k, _ = codebook.shape
    per_group = codebook_q.detach().view(G, H // G, S_q, Dk) @ codebook.detach().transpose(-1, -2).unsqueeze(1)
    return per_group.view(H, S_q, S_k)  # (G, R, S_q, S_k) -> (H, S_q, S_k)


class _TableLookup(torch.autograd.Function):
    """Forward: ``T[h, z_q]``; backward: ``grad @ C_K`` for ``q_hat``, nothing for the codes, table or codebook."""

    @staticmethod
    def forward(ctx, q_hat, z_q, table, codebook):
        ctx.save_for_backward(codebook)
        heads = torch.arange(table.shape[0], device=z_q.device)[:, None]  # (H, 1), broadcast against z_q (B, H, T)
        return table[heads, z_q]  # (B, H, T, S_k)

    @staticmethod
    def backward(ctx, grad_scores):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        (codebook,) = ctx.saved_tensors
        B, H, T, S_k = grad_scores.shape
        G, _, Dk = codebook.shape
        # The gradient of q_hat @ C_K^T: one (R T, S_k) x (S_k, Dk) product per group.
        grad = grad_scores.reshape(B, G, H // G * T, S_k) @ codebook.to(grad_scores.dtype).unsqueeze(0)
        return grad.view(B, H, T, Dk), None, None, None


def lookup_code_scores(q_hat: torch.Tensor, z_q: torch.Tensor, table: torch.Tensor,
                       codebook: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, S_k]`` scores of each quantized query against its group's key codewords, ``q_hat @ C_K^T``.

    The value is read from ``table`` (:func:`code_pair_table`) at the rows ``z_q [B, H, T]``, so ``q_hat`` must equal
    ``codebook_q[h, z_q]``; the gradient for ``q_hat [B, H, T, Dk]`` is that of the product, through ``codebook
    [G, S_k, Dk]``. Codes, table and codebook get none.
    """
    return _TableLookup.apply(q_hat, z_q, table, codebook.detach())


def check_query_codes(q_hat: torch.Tensor, z_q: torch.Tensor, codebook_q: torch.Tensor, codebook: torch.Tensor,
                      table: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the first bad input of the query side (``q_hat`` and ``codebook`` already checked).

    ``z_q [B, H, T]`` int64 in ``[0, S_q)`` (read where :func:`~transformer_vq.ops.protocol.reads_values` allows, as
    the key codes), ``codebook_q [H, S_q, Dk]`` of the queries' width and a dtype of the call, and the table, when
    given, a floating ``[H, S_q, S_k]`` tensor (any floating dtype, as the key-only operator's ``code_scores``); all on
    ``q_hat``'s device.
    """
    check_is_tensor(codebook_q, "codebook_q")
    check_is_tensor(z_q, "z_q")
    if table is not None:
        check_is_tensor(table, "table")
    B, H, T, Dk = q_hat.shape
    if codebook_q.dim() != 3 or codebook_q.shape[0] != H or codebook_q.shape[2] != Dk:
        raise ValueError(f"codebook_q must be [H, S_q, Dk] = [{H}, S_q, {Dk}], got {list(codebook_q.shape)}")
    S_q = codebook_q.shape[1]
    if z_q.shape != (B, H, T):
        raise ValueError(f"z_q must be [B, H, T] = [{B}, {H}, {T}], got {list(z_q.shape)}")
    if z_q.dtype != torch.long:
        raise ValueError(f"z_q must be int64 shortcodes, got {z_q.dtype}")
    if table is not None and table.shape != (H, S_q, codebook.shape[1]):
        raise ValueError(f"table must be [H, S_q, S_k] = [{H}, {S_q}, {codebook.shape[1]}], got {list(table.shape)}")
    if table is not None:
        check_floating(table, "table")
    check_devices(q_hat, {"z_q": z_q, "table": table})
    check_like(q_hat, {"codebook_q": codebook_q})
    check_code_range(z_q, S_q, "z_q", "S_q")
