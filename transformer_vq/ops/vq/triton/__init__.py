"""The fused Triton backend of VQ attention (``vq_attention(..., backend="triton")``, docs/operator.md).

* :mod:`~transformer_vq.ops.vq.triton.tiles`: device functions shared by the kernels (tiles, scores, online softmax);
* :mod:`~transformer_vq.ops.vq.triton.forward`: the forward kernel;
* :mod:`~transformer_vq.ops.vq.triton.backward`: the backward kernels;
* :mod:`~transformer_vq.ops.vq.triton.function`: the autograd Function tying them;
* :mod:`~transformer_vq.ops.vq.triton.blocks`: whole blocks through the Function, in the eager kernel's signature.

Importing this package imports ``triton``; :mod:`transformer_vq.ops.vq.attention` does so only when the backend is
asked for.
"""

from transformer_vq.ops.vq.triton.blocks import attend_blocks_fused, check_fused_inputs

__all__ = ["attend_blocks_fused", "check_fused_inputs"]
