"""Pure attention operators: the math, with no parameters (docs/operator.md).

One package per operator, each with its kernel(s), its state and a ``naive`` reference that is slow and obviously
right: :mod:`~transformer_vq.ops.vq` (the linear-time operator), :mod:`~transformer_vq.ops.full` (softmax, quadratic),
:mod:`~transformer_vq.ops.flash` (FLASH-Quad and FLASH), :mod:`~transformer_vq.ops.vq_bidir` (non-causal VQ
attention, which returns no state), :mod:`~transformer_vq.ops.vq_qk` (queries quantized too, causal and non-causal).
Every kernel is called the same way
(:class:`~transformer_vq.ops.protocol.AttentionKernel`) and returns a state satisfying
:class:`~transformer_vq.ops.protocol.AttentionState` (``None`` for the non-causal one); ``KERNELS`` maps each
``attn_type`` to its kernel. Beside the attention operators, :mod:`~transformer_vq.ops.ema` holds LongVQ's state
space layer (Mega's damped EMA): an FFT convolution and the recurrence it is tested against.
"""

from transformer_vq.ops.flash import FlashState, flash_attention, flash_quad_attention
from transformer_vq.ops.full import KVCache, full_attention
from transformer_vq.ops.protocol import AttentionKernel, AttentionState
from transformer_vq.ops.vq import VQAttentionState, vq_attention, vq_attention_blockwise, vq_attention_naive
from transformer_vq.ops.vq_bidir import vq_bidir_attention, vq_bidir_attention_naive
from transformer_vq.ops.vq_qk import code_pair_table, vq_qk_attention, vq_qk_attention_noncausal

KERNELS: dict[str, AttentionKernel] = {
    "vq": vq_attention,
    "full": full_attention,
    "flash_quad": flash_quad_attention,
    "flash": flash_attention,
}
"""The kernel of each ``attn_type`` of ``transformer_vq.config.ATTN_TYPES``."""

__all__ = ["KERNELS", "AttentionKernel", "AttentionState", "vq_attention", "vq_attention_naive",
           "vq_attention_blockwise", "VQAttentionState", "full_attention", "KVCache", "flash_attention",
           "flash_quad_attention", "FlashState", "vq_bidir_attention", "vq_bidir_attention_naive",
           "vq_qk_attention", "vq_qk_attention_noncausal", "code_pair_table"]
