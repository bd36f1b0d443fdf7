"""Full softmax attention, the quadratic baseline: the SDPA kernel, its growing cache, the dense formula."""

from transformer_vq.ops.full.attention import full_attention
from transformer_vq.ops.full.naive import full_attention_naive
from transformer_vq.ops.full.state import KVCache

__all__ = ["full_attention", "full_attention_naive", "KVCache"]
