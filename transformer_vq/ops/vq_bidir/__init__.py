"""Non-causal VQ attention (Theorems 3.4-3.5, LongVQ's local bias): the kernel, its summaries, its scorings, the
dense oracle."""

from transformer_vq.ops.vq_bidir.attention import vq_bidir_attention
from transformer_vq.ops.vq_bidir.naive import vq_bidir_attention_naive
from transformer_vq.ops.vq_bidir.scoring import SCORINGS

__all__ = ["vq_bidir_attention", "vq_bidir_attention_naive", "SCORINGS"]
