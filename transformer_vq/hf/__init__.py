"""Transformer-VQ in Hugging Face ``transformers`` (the optional extra ``hf``): a config, a causal LM with
``generate`` and ``save_pretrained`` / ``from_pretrained``, and the VQ attention state as a ``transformers`` cache.
docs/huggingface.md shows their use.

``import transformer_vq.hf`` registers the model with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM``
(here, in these few lines, and nowhere else; ``import transformer_vq`` alone imports neither torch nor
``transformers``). A directory written by ``save_pretrained`` or ``tvq export --format hf`` also loads with
``trust_remote_code=True`` in a process that imported nothing of this library (its ``auto_map``).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from transformer_vq.hf.cache import TransformerVQCache
from transformer_vq.hf.configuration import MODEL_TYPE, TransformerVQHFConfig
from transformer_vq.hf.modeling import TransformerVQForCausalLM

__all__ = ["TransformerVQHFConfig", "TransformerVQForCausalLM", "TransformerVQCache"]

# exist_ok: registering the same classes again (importlib.reload, or the remote code of a saved directory) is harmless
AutoConfig.register(MODEL_TYPE, TransformerVQHFConfig, exist_ok=True)
AutoModel.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
