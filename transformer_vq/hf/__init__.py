"""Transformer-VQ in Hugging Face ``transformers`` (the optional extra ``hf``): a config, a causal LM with
``generate`` and ``save_pretrained`` / ``from_pretrained``, and the VQ attention state as a ``transformers`` cache.
docs/huggingface.md shows their use.

The names below are imported on first use: ``transformer_vq.hf.export`` (whose safetensors format needs no
``transformers``) and ``transformer_vq.hf.hook`` stay importable without ``transformers``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TransformerVQHFConfig": "transformer_vq.hf.configuration",
    "TransformerVQForCausalLM": "transformer_vq.hf.modeling",
    "TransformerVQCache": "transformer_vq.hf.cache",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'transformer_vq.hf' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
