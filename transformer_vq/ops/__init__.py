"""Pure attention functions: the math, with no parameters.

``vq_attention`` is the linear-time operator; ``vq_attention_reference`` the dense formula it must equal.
"""

from transformer_vq.ops.reference import vq_attention_reference, window_bias_matrix
from transformer_vq.ops.vq_attention import REDUCTIONS, VQAttentionState, vq_attention

__all__ = ["vq_attention", "vq_attention_reference", "window_bias_matrix", "VQAttentionState", "REDUCTIONS"]
