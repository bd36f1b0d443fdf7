"""VQ attention, the linear-time operator (Theorem 3.7): the kernel, its state, its cache math, two naive oracles."""

from transformer_vq.ops.vq.attention import vq_attention
from transformer_vq.ops.vq.naive import vq_attention_blockwise, vq_attention_naive
from transformer_vq.ops.vq.state import VQAttentionState

__all__ = ["vq_attention", "vq_attention_naive", "vq_attention_blockwise", "VQAttentionState"]
