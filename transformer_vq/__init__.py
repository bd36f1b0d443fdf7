"""Transformer-VQ in PyTorch: softmax attention in linear time through vector-quantized keys.

Lingle, "Transformer-VQ: Linear-Time Transformers via Vector Quantization", ICLR 2024.
"""

__version__ = "0.1.0"

from transformer_vq.config import TransformerVQConfig, preset, PRESETS  # noqa: E402
from transformer_vq.nn.quantizer import VectorQuantizer  # noqa: E402
from transformer_vq.nn.attention import VQAttention  # noqa: E402
from transformer_vq.nn.model import TransformerVQ, ModelOutput, ModelState  # noqa: E402
from transformer_vq.ops import vq_attention, vq_attention_reference  # noqa: E402

__all__ = [
    "__version__",
    "TransformerVQConfig",
    "preset",
    "PRESETS",
    "VectorQuantizer",
    "VQAttention",
    "TransformerVQ",
    "ModelOutput",
    "ModelState",
    "vq_attention",
    "vq_attention_reference",
]
