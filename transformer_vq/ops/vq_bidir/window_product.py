"""``weights @ values`` over each query block's three-block window, read from the value blocks in place.

Query block ``n`` weighs the keys of blocks ``n - 1 .. n + 1`` (window column ``j`` is key ``j`` of that run; the
blocks before the first and after the last do not exist and weigh nothing). The plain product pads the values by a
block on each side and unfolds them into ``[N, 3L, Dv]`` windows, three copies of every value block
(:func:`window_product_naive`); :class:`WindowProduct` adds three block products into one output instead, and its
backward is those three products transposed, written out: autograd through in-place adds into slices of the output
would copy the whole output's gradient once per slice.

Letters: B batch, G groups, N blocks, t query rows of a block (``R L``: heads times block length), L block length,
Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.vq.kernels import add_product

def _pairs(N: int) -> list[tuple[int, slice, slice]]:
    """``(j, query blocks, value blocks)`` for window block ``j`` (0: the block before, 1: the query's own, 2: the
    block after): the query blocks that have it and the value blocks they read, as slices of the ``N`` blocks."""
    pairs = [(0, slice(1, N), slice(0, N - 1)), (1, slice(0, N), slice(0, N)), (2, slice(0, N - 1), slice(1, N))]
    return [pair for pair in pairs if N > 1 or pair[0] == 1]


def window_product(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[B, G, N, t, Dv]``: ``sum_j weights[..., n, :, j] values[n - 1 + j (block, key)]`` for ``weights [B, G, N,
    t, 3L]`` and ``values [B, G, N, L, Dv]`` (``weights`` taken in ``values``' dtype)."""
    return WindowProduct.apply(weights.to(values.dtype), values)


class WindowProduct(torch.autograd.Function):
    """:func:`window_product` with its backward: ``d weights[..., j] = g @ values_j^T`` and ``d values_j += weights[...,
    j]^T @ g`` for each window block ``j`` (keeps ``weights`` and ``values``, which the product needs anyway)."""

    @staticmethod
    def forward(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return add_window_product(weights.new_zeros(*weights.shape[:-1], values.shape[-1]), weights, values)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, values = ctx.saved_tensors
        return window_product_grads(weights, values, grad, *ctx.needs_input_grad)


def window_product_grads(weights: torch.Tensor, values: torch.Tensor, grad: torch.Tensor, of_weights: bool = True,
                         of_values: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :func:`window_product`'s ``weights`` and ``values`` (each ``None`` where not asked) from the
    output's gradient ``grad [B, G, N, t, Dv]``."""
    L, N = values.shape[-2], values.shape[2]
    grad_weights = torch.zeros_like(weights) if of_weights else None
    grad_values = torch.zeros_like(values) if of_values else None
    for j, queries, keys in _pairs(N):
        g = grad[:, :, queries]
        if grad_weights is not None:
            grad_weights[:, :, queries, :, j * L:(j + 1) * L] = g @ values[:, :, keys].transpose(-1, -2)
        if grad_values is not None:
            _add_product(grad_values[:, :, keys], weights[:, :, queries, :, j * L:(j + 1) * L].transpose(-1, -2), g)
    return grad_weights, grad_values


def add_window_product(total: torch.Tensor, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``total += window_product(weights, values)`` in place, without autograd (the forward of
    :class:`WindowProduct`, and an inference caller's accumulation into a product it already holds); returns
    ``total``."""
    L = values.shape[-2]
    for j, queries, keys in _pairs(values.shape[2]):
        _add_product(total[:, :, queries], weights[:, :, queries, :, j * L:(j + 1) * L], values[:, :, keys])
    return total


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``total += a @ b`` in place (``[B, G, n, ...]`` blocks): one ``baddbmm_`` where ``total`` is one piece of
    memory (one batch row and group), else through a product made beside it."""
    if total.is_contiguous():
        add_product(total, a, b)
    else:
        total += a @ b


def window_product_naive(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The same product from the unfolded windows of the values padded by one empty block on each side."""
    L = values.shape[-2]
    B, G, N, _, Dv = values.shape
    padded = F.pad(values.flatten(2, 3), (0, 0, L, L))  # (B, G, (N + 2) L, Dv)
    windows = padded.unfold(2, 3 * L, L).transpose(-1, -2)  # (B, G, N, 3L, Dv)
    return weights.to(values.dtype) @ windows
