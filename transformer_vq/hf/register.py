"""Registering the model with ``transformers``' auto classes (importing this module does it, once).

After it, ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` recognize ``model_type: transformer_vq`` in a
``config.json`` and build :class:`~transformer_vq.hf.modeling.TransformerVQForCausalLM` with no
``trust_remote_code``: the code is this installed library's, not a downloaded file.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from transformer_vq.hf.configuration import MODEL_TYPE, TransformerVQHFConfig
from transformer_vq.hf.modeling import TransformerVQForCausalLM

# exist_ok: a second registration of the same classes (e.g. after importlib.reload) is harmless
AutoConfig.register(MODEL_TYPE, TransformerVQHFConfig, exist_ok=True)
AutoModel.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
