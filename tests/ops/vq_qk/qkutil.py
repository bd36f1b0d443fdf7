"""Inputs of the operators with quantized queries, shared by their tests."""

from __future__ import annotations

import torch


def make_qk_inputs(B, H, G, T, L, S_q, S_k, Dk=6, Dv=7, *, dtype=torch.float64, seed=0):
    """``q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias`` with ``q_hat = codebook_q[h, z_q]`` and
    ``k_hat = codebook[g, z]`` exactly, as the quantizers produce them."""
    gen = torch.Generator().manual_seed(seed)
    codebook_q = torch.randn(H, S_q, Dk, generator=gen, dtype=dtype)
    codebook = torch.randn(G, S_k, Dk, generator=gen, dtype=dtype)
    z_q = torch.randint(0, S_q, (B, H, T), generator=gen)
    z = torch.randint(0, S_k, (B, G, T), generator=gen)
    q_hat = codebook_q[torch.arange(H)[:, None], z_q]  # (B, H, T, Dk)
    k_hat = codebook[torch.arange(G)[:, None], z]  # (B, G, T, Dk)
    v = torch.randn(B, G, T, Dv, generator=gen, dtype=dtype)
    bias = torch.randn(B, H, T, 2 * L, generator=gen, dtype=dtype)
    return q_hat, z_q, codebook_q, k_hat, z, codebook, v, bias


def qk_grid_id(params):
    B, H, G, T, L, S_q, S_k = params
    return f"B{B}-H{H}-G{G}-T{T}-L{L}-Sq{S_q}-Sk{S_k}"
