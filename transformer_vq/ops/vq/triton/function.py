"""The autograd Function tying the fused forward kernel to the fused backward kernels.

Its inputs are what the kernels read: the queries, the window keys and values of blocks ``-1 .. N-1``, the bias, the
codebook (a constant), the per-block log-counts (no gradient: counts are whole numbers), the per-block cache means and,
for packed documents, the document ids ``segment`` and ``cache_segment`` (:mod:`~.tiles`; ``None`` without).
It returns gradients for ``q``, ``k_all``, ``v_all``, ``bias`` and the cache means; autograd carries the last through
the reduction of :mod:`transformer_vq.ops.vq.cache` back to the values, exactly as in the eager operator. ``k_all``
receives gradient only from the window: older keys enter through the constant codebook, which is the eager operator's
truncation (docs/operator.md, "Gradients").

Letters: B batch, H heads, G groups, T = N L query rows, S codewords, Dk / Dv key / value widths.
"""

from __future__ import annotations

import torch
import triton

from transformer_vq.ops.vq.triton.backward import cache_grad_kernel, query_grad_kernel, window_grad_kernel
from transformer_vq.ops.vq.triton.forward import forward_kernel


DV_CHUNK = 128
"""The most value columns one program holds."""


def tile_sizes(L: int, S: int, Dk: int, Dv: int) -> dict:
    """Block sizes of the kernels: powers of two of at least 16 (``tl.dot``'s least), at most 64 rows or keys and
    ``DV_CHUNK`` value columns (wider values are split over programs or loops); the key width is held whole."""
    def fit(x):
        return max(16, triton.next_power_of_2(x))
    return dict(BLOCK_M=min(64, fit(L)), BLOCK_N=min(64, fit(L)), BLOCK_S=min(64, fit(S)),
                BLOCK_DK=fit(Dk), BLOCK_DV=min(DV_CHUNK, fit(Dv)))


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs are multiplied in full float32 ("ieee"), not TF32, so that they match the eager operator."""
    return "ieee" if dtype == torch.float32 else "tf32"


class FusedVQAttention(torch.autograd.Function):
    """``out [B, H, T, Dv]`` of whole blocks from ``q, k_all, v_all, bias, codebook, log_count, cache_mean`` (and
    ``segment, cache_segment`` for packed documents)."""

    @staticmethod
    def forward(ctx, q, k_all, v_all, bias, codebook, log_count, cache_mean, block_len: int, has_prev: bool,
                segment=None, cache_segment=None):
        B, H, T, Dk = q.shape
        G, S, _ = codebook.shape
        Dv = v_all.shape[-1]
        sizes = tile_sizes(block_len, S, Dk, Dv)
        kernel_inputs = _kernel_inputs(q, k_all, v_all, bias, codebook, log_count, cache_mean, segment, cache_segment)
        out = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        grid = (B * H, T // block_len * triton.cdiv(block_len, sizes["BLOCK_M"]), triton.cdiv(Dv, sizes["BLOCK_DV"]))
        forward_kernel[grid](*kernel_inputs, out, lse, H, H // G, T, block_len, S, Dk, Dv, int(has_prev),
                             PRECISION=dot_precision(q.dtype), DOCS=segment is not None, **sizes)
        ctx.save_for_backward(*kernel_inputs, out, lse)
        ctx.block_len, ctx.has_prev, ctx.docs = block_len, has_prev, segment is not None
        ctx.dtypes = [x.dtype for x in (q, k_all, v_all, bias, cache_mean)]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k_all, v_all, bias, codebook, log_count, cache_mean, segment, cache_segment, out, lse = ctx.saved_tensors
        B, H, T, Dk = q.shape
        G, S, _ = codebook.shape
        Dv, L, N = v_all.shape[-1], ctx.block_len, T // ctx.block_len
        sizes = tile_sizes(L, S, Dk, Dv)
        grad_out = grad_out.to(q.dtype).contiguous()
        # D[row] = dO . O = sum_j p_j dp_j: the term every score gradient subtracts (flash-attention's backward).
        delta = (grad_out.float() * out.float()).sum(-1)
        inputs = (q, k_all, v_all, bias, codebook, log_count, cache_mean, segment, cache_segment, grad_out, lse, delta)
        dims = dict(H=H, R=H // G, T=T, L=L, S=S, Dk=Dk, Dv=Dv, has_prev=int(ctx.has_prev),
                    PRECISION=dot_precision(q.dtype), DOCS=ctx.docs, **sizes)
        dq = torch.empty(B, H, T, Dk, dtype=torch.float32, device=q.device)
        dbias = torch.zeros(B, H, T, 2 * L, dtype=torch.float32, device=q.device)
        query_grad_kernel[(B * H, N * triton.cdiv(L, sizes["BLOCK_M"]))](*inputs, dq, dbias, **dims)
        chunks = triton.cdiv(Dv, sizes["BLOCK_DV"])
        dk = torch.zeros(B, G, T + L, Dk, dtype=torch.float32, device=q.device)
        window_grad_kernel[(B * G, (N + 1) * triton.cdiv(L, sizes["BLOCK_N"]), 1)](*inputs, dk, **dims, GRAD_KEYS=True)
        dv = torch.zeros(B, G, T + L, Dv, dtype=torch.float32, device=q.device)
        window_grad_kernel[(B * G, (N + 1) * triton.cdiv(L, sizes["BLOCK_N"]), chunks)](*inputs, dv, **dims,
                                                                                        GRAD_KEYS=False)
        dmean = torch.empty(B, G, N, S, Dv, dtype=torch.float32, device=q.device)
        cache_grad_kernel[(B * G, N * triton.cdiv(S, sizes["BLOCK_S"]), chunks)](*inputs, dmean, **dims)
        dq, dk, dv, dbias, dmean = (g.to(t) for g, t in zip((dq, dk, dv, dbias, dmean), ctx.dtypes))
        return dq, dk, dv, dbias, None, None, dmean, None, None, None, None


def _kernel_inputs(q, k_all, v_all, bias, codebook, log_count, cache_mean, segment, cache_segment):
    """The kernels' operands: contiguous, queries, keys, values and codewords in one dtype (``tl.dot`` wants one);
    log-counts and cache means in float32 (the eager operator's accumulation dtype at least); document ids in int32
    (one unread id each without packed documents: a kernel argument must be a tensor)."""
    dtype = q.dtype
    if segment is None:
        segment = cache_segment = torch.zeros(1, dtype=torch.int32, device=q.device)
    return (q.contiguous(), k_all.to(dtype).contiguous(), v_all.to(dtype).contiguous(), bias.contiguous(),
            codebook.to(dtype).contiguous(), log_count.float().contiguous(), cache_mean.float().contiguous(),
            segment.to(torch.int32).contiguous(), cache_segment.to(torch.int32).contiguous())
