"""The FLASH baselines inside the gated attention unit: the window bias enters divided by the kernel's normalizer
``n``, so the pre-activation is ``(q . k + beta) / n`` and a fresh model's output has the scale of the other cores'."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_vq import TransformerVQ, preset
from transformer_vq.nn.attend import attend, flash_norm
from transformer_vq.ops.flash import flash_attention_naive, flash_quad_attention_naive


@pytest.mark.parametrize("attn_type", ["flash", "flash_quad"])
def test_unit_passes_the_bias_divided_by_the_normalizer(attn_type):
    """``attend`` equals the defining formula with ``beta / n``: n = flash_chunk_len for 'flash', L for 'flash_quad'."""
    torch.manual_seed(0)
    cfg = preset("tiny", attn_type=attn_type, block_len=4, flash_chunk_len=8)
    B, H, T, Dk, Dv, L = 2, cfg.n_head, 24, 8, 6, cfg.block_len
    q, k = torch.randn(B, H, T, Dk, dtype=torch.float64), torch.randn(B, H, T, Dk, dtype=torch.float64)
    v, bias = torch.randn(B, H, T, Dv, dtype=torch.float64), torch.randn(B, H, T, 2 * L, dtype=torch.float64)
    out, _ = attend(cfg, q, k, v, bias, state=None, mask=None, attention="linear")
    n = flash_norm(cfg)
    assert n == (8 if attn_type == "flash" else L)
    if attn_type == "flash":
        expected = flash_attention_naive(q, k, v, bias / n, block_len=L, chunk_len=n)
    else:
        expected = flash_quad_attention_naive(q, k, v, bias / n, block_len=L)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def bits_per_byte_at_init(attn_type: str) -> tuple[float, float]:
    """Loss (bits per byte) and logits' standard deviation of a fresh ``small`` model on random bytes."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("small", attn_type=attn_type, block_len=128, flash_chunk_len=128)).eval()
    ids = torch.randint(0, 256, (1, 256))
    with torch.no_grad():
        logits = model(ids).logits
    loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
    return loss.item() / math.log(2), logits.std().item()


@pytest.mark.parametrize("attn_type", ["flash", "flash_quad"])
def test_fresh_flash_model_starts_like_the_softmax_cores(attn_type):
    """With chunks of 128 the undivided bias made logits ~10-20x too large (a first loss of 29-67 bits per byte);
    a fresh FLASH model now starts within half a bit of the unquantized softmax GAU, near log2(256) = 8."""
    flash_bpb, flash_std = bits_per_byte_at_init(attn_type)
    full_bpb, full_std = bits_per_byte_at_init("full")
    assert abs(flash_bpb - full_bpb) < 0.5
    assert flash_std < 2 * full_std
