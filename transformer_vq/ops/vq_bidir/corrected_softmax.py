"""The softmax of :func:`~transformer_vq.ops.vq_bidir.scoring.combine_corrected` as one autograd Function that keeps
its inputs and recomputes its scores in the backward (the FlashAttention trade: products again instead of keeping
``T x (S + 3L)`` weights).

Under autograd the combine keeps every weight it makes: the codes' ``exp`` (``T x S``), the window's two ``exp`` and
their difference (``3 x T x 3L``), a quarter of a LongVQ block's memory at the peak of its backward. This Function
keeps the queries, the key windows, the bias, the summary and the values (which the layer holds anyway), the row
shift and normalizer and the output, and rebuilds the weights in the backward, the codes' first and the window's once
those are used up (`benchmarks/longvq_block_memory.py`: the block's live peak of forward + backward at 4k 100 -> 88
MiB, at 16k 389 -> 338). Its twin is the autograd path of ``combine_corrected``, which a caller's own ``code_scores``,
``relu2`` and autocast still take (the same forward, op for op, so the two agree bit for bit; the gradients to
float64 rounding).

With ``g`` the output's gradient, ``out = num / Z``, ``delta = sum(g * out) / Z``: a weight ``w`` of value row ``u``
gets ``dw = (g . u) / Z - delta``; a code weight ``w = exp(q . C + log c - m)`` gives ``d(q . C) = w dw``; a window
weight ``exp(s - m) - exp(s0 - m)`` (``s = q . k + beta``, ``s0 = q . k`` with ``k`` detached) gives ``ds = exp(s -
m) dw`` to ``q``, ``k`` and ``beta`` and ``ds0 = -exp(s0 - m) dw`` to ``q`` only.

Letters: B batch, G groups, R heads per group, H = G R, N blocks, L block length, S codewords, Dk key width, Dv value
width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.vq_bidir.window_product import add_window_product, window_product_grads


def _code_scores(q, codebook, logits, n_blocks):
    """``q . C + log c`` ``[B, G, N, R, L, S]``, fresh; the operator's own order of operations (``codeword_scores``),
    so both paths round alike."""
    B, H, T, Dk = q.shape
    G, S, _ = codebook.shape
    codes = (q.reshape(B, G, H // G * T, Dk) @ codebook.transpose(-1, -2).unsqueeze(0))
    return codes.view(B, G, H // G, n_blocks, T // n_blocks, S).transpose(2, 3).add_(logits)


def _window_scores(q, k_window, bias, hidden):
    """``(q . k + beta, q . k)`` ``[B, G, N, R, L, 3L]`` of the window's keys, fresh, ``-inf`` where hidden."""
    B, H, T, Dk = q.shape
    G, N = k_window.shape[1:3]
    qk = q.view(B, G, H // G, N, T // N, Dk).transpose(2, 3) @ k_window.unsqueeze(3)  # (B, G, N, R, L, 3L)
    window = (qk + bias).masked_fill_(hidden, float("-inf"))
    return window, qk.masked_fill_(hidden, float("-inf"))


class CorrectedSoftmax(torch.autograd.Function):
    """``out [B, G, N, R, L, Dv]`` from ``q [B, H, N L, Dk]`` (padded to whole blocks), ``k_window [B, G, N, Dk,
    3L]``, ``bias [B, G, N, R, L, 3L]``, the summary ``mean [B, G, S, Dv]``, ``v_blocks [B, G, N, L, Dv]``, and the
    constants ``codebook [G, S, Dk]``, ``logits`` (log counts, broadcast over the code scores) and ``hidden``
    (broadcast over the window scores)."""

    @staticmethod
    def forward(ctx, q, k_window, bias, mean, v_blocks, codebook, logits, hidden):
        codes = _code_scores(q, codebook, logits, k_window.shape[2])
        window, key_codes = _window_scores(q, k_window, bias, hidden)
        B, G, N, R, L, S = codes.shape
        shift = torch.maximum(codes.amax(dim=-1), window.amax(dim=-1)).unsqueeze(-1)
        w_code = codes.sub_(shift).exp_()
        w_window = window.sub_(shift).exp_().sub_(key_codes.sub_(shift).exp_())
        del key_codes
        denominator = w_code.sum(dim=-1, keepdim=True) + w_window.sum(dim=-1, keepdim=True)
        w_window = w_window.flatten(3, 4)
        numerator = add_window_product(w_window.new_zeros(B, G, N, R * L, v_blocks.shape[-1]), w_window, v_blocks)
        numerator = numerator.view(B * G, N * R * L, -1).baddbmm_(w_code.reshape(B * G, N * R * L, S),
                                                                  mean.reshape(B * G, S, -1))
        out = numerator.view(B, G, N, R, L, -1).div_(denominator)
        ctx.save_for_backward(q, k_window, bias, mean, v_blocks, codebook, logits, hidden, shift, denominator, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k_window, bias, mean, v_blocks, codebook, logits, hidden, shift, denominator, out = ctx.saved_tensors
        B, G, N, R, L, Dv = out.shape
        S, Dk = codebook.shape[1:]
        g = grad / denominator  # the numerator's gradient
        delta = (grad * out).sum(dim=-1, keepdim=True) / denominator  # minus the normalizer's
        # the codes: dw = g . mean - delta, d(q . C) = w dw (each tensor dropped as soon as it is used up, the
        # window's scores made only then)
        w_code = _code_scores(q, codebook, logits, N).sub_(shift).exp_().reshape(B * G, N * R * L, S)
        g_rows = g.reshape(B * G, N * R * L, Dv)
        d_code = (g_rows @ mean.reshape(B * G, S, Dv).transpose(-1, -2)).view(B, G, N, R, L, S).sub_(delta)
        grad_mean = (w_code.transpose(-1, -2) @ g_rows).view(B, G, S, Dv)
        d_code.mul_(w_code.view(B, G, N, R, L, S))
        del w_code
        grad_q = d_code @ codebook[None, :, None, None]  # (B, G, N, R, L, Dk)
        del d_code
        # the window: dw = g . v - delta; the live scores' gradient e1 dw, the detached ones' -e2 dw
        e1, key_codes = _window_scores(q, k_window, bias, hidden)
        e1 = e1.sub_(shift).exp_()
        w_window = key_codes.sub_(shift).exp_().neg_().add_(e1)  # e1 - e2, in e2's place
        del key_codes
        d_window, grad_v = window_product_grads(w_window.flatten(3, 4), v_blocks, g.flatten(3, 4),
                                                True, ctx.needs_input_grad[4])
        d_window = d_window.view_as(e1).sub_(delta)
        grad_q += w_window.mul_(d_window) @ k_window.unsqueeze(3).transpose(-1, -2)  # e1 dw - e2 dw: both reach q
        del w_window
        d_live = e1.mul_(d_window)  # (B, G, N, R, L, 3L): the bias's gradient, and through it the keys'
        grad_k = (q.view(B, G, R, N, L, Dk).transpose(2, 3).transpose(-1, -2) @ d_live).sum(dim=3)
        grad_q = grad_q.transpose(2, 3).reshape(q.shape)
        return grad_q, grad_k, d_live, grad_mean, grad_v, None, None, None
