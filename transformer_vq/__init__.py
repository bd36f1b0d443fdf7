"""Transformer-VQ in PyTorch: softmax attention in linear time through vector-quantized keys.

Lingle, "Transformer-VQ: Linear-Time Transformers via Vector Quantization", ICLR 2024.

The public names below are imported on first use, so that ``import transformer_vq.cli`` (the ``tvq``
command) can set up the process (thread policy) before PyTorch is loaded.
The ``transformers`` classes live in :mod:`transformer_vq.hf` (the extra ``hf``); importing it registers them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "TransformerVQConfig": "transformer_vq.config",
    "preset": "transformer_vq.config",
    "PRESETS": "transformer_vq.config",
    "VectorQuantizer": "transformer_vq.nn.quantizer",
    "GatedAttentionUnit": "transformer_vq.models.tvq.gau",
    "TransformerVQ": "transformer_vq.models.tvq.model",
    "ModelOutput": "transformer_vq.models.tvq.model",
    "ModelState": "transformer_vq.nn.state",
    "vq_attention": "transformer_vq.ops",
    "vq_attention_naive": "transformer_vq.ops",
}

__all__ = ["__version__", *_EXPORTS]

def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'transformer_vq' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
