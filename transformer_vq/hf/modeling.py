"""The ``transformers`` causal language model of Transformer-VQ: the library's :class:`TransformerVQ` inside a
``PreTrainedModel`` (``save_pretrained`` / ``from_pretrained`` with safetensors) and ``GenerationMixin``
(``generate``), the VQ attention state carried between steps in a :class:`TransformerVQCache`.

The wrapper computes nothing itself: every logit comes from the wrapped module (``self.model``), so the math lives
in one place (``transformer_vq.nn``). Its weights and EMA codebook buffers are saved under the same names as the
library's state dict, prefixed ``model.``.

Importing this module registers the classes with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` (no
``trust_remote_code``: the code is this installed library's); ``transformer_vq.hf.hook`` imports it when
``transformers`` is imported.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from transformer_vq.hf.cache import TransformerVQCache
from transformer_vq.hf.configuration import MODEL_TYPE, TransformerVQHFConfig
from transformer_vq.nn.gau import GatedAttentionUnit
from transformer_vq.nn.model import TransformerVQ

IGNORE_INDEX = -100  # the label transformers uses for positions without a target


class TransformerVQPreTrainedModel(PreTrainedModel):
    """What every ``transformers`` class of this model shares: its config class and how weights are initialized."""

    config_class = TransformerVQHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["GatedAttentionUnit"]

    def init_weights(self) -> None:
        """Nothing to do: the library's constructor has already initialized every tensor, and nothing is tied."""

    @torch.no_grad()
    def _init_weights(self, module: torch.nn.Module) -> None:
        """The library's own initialization, for what a checkpoint did not provide.

        ``from_pretrained`` builds the model on the meta device, loads the checkpoint, then calls this for every
        module whose tensors were not all loaded: parameters are re-drawn by the owning unit's
        ``reset_parameters`` (``transformers`` skips the tensors it loaded), and the non-persistent buffers (the
        quantizers' per-step statistics, never saved) get their constructor's value, zero.
        """
        if isinstance(module, (TransformerVQ, GatedAttentionUnit)):
            module.reset_parameters()
        for name, buffer in module.named_buffers(recurse=False):
            if name in module._non_persistent_buffers_set:
                buffer.zero_()


class TransformerVQForCausalLM(TransformerVQPreTrainedModel, GenerationMixin):
    """Transformer-VQ for ``transformers``: ``model(input_ids, past_key_values=cache)`` and ``generate``.

    ``AutoModel`` gives this class too: the library's model ends in its output head (tied or not) and has no
    headless form to expose.
    """

    def __init__(self, config: TransformerVQHFConfig):
        super().__init__(config)
        model_config = config.model_config()
        if not model_config.causal:
            raise ValueError("TransformerVQForCausalLM needs a causal model; this config is an encoder (causal=False), "
                             "which cannot generate")
        self.model = TransformerVQ(model_config)
        self.post_init()

    @classmethod
    def from_library_model(cls, model: TransformerVQ) -> "TransformerVQForCausalLM":
        """A ``transformers`` model holding a copy of ``model``'s weights and codebooks (same device and dtype)."""
        param = next(model.parameters())
        wrapped = cls(TransformerVQHFConfig.from_model_config(model.cfg)).to(device=param.device, dtype=param.dtype)
        wrapped.model.load_state_dict(model.state_dict())
        return wrapped.train(model.training)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not make a key/value cache: forward makes its own TransformerVQCache

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Linear | None:
        return self.model.head  # None when tied: the head is then a scaled product with the embedding

    def forward(self, input_ids: torch.LongTensor, past_key_values: TransformerVQCache | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, return_dict: bool | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """Next-token logits of ``input_ids`` ``[B, T]``, continuing the sequences of ``past_key_values``.

        Args:
            past_key_values: the cache a previous call returned, or ``None`` at the sequences' start.
            attention_mask: ``[B, P + T]``, all ones (padding is not supported: the model attends to every position).
            labels: ``[B, T]`` token ids, ``-100`` where no loss is wanted; position t is the target of position
                t - 1, as in ``transformers``. The loss is the library's (cross-entropy plus ``commit_coef`` times the
                commitment loss, Eq. 35), over the positions that have a target.
            use_cache: return the cache (default ``config.use_cache``).
        """
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("attention_mask with padding is not supported: Transformer-VQ attends to every "
                             "position; batch prompts of equal length (or generate them one at a time)")
        if past_key_values is not None and not isinstance(past_key_values, TransformerVQCache):
            raise ValueError(f"past_key_values must be a TransformerVQCache (or None), got "
                             f"{type(past_key_values).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        targets, loss_mask = (None, None) if labels is None else shifted_targets(labels)
        out = self.model(input_ids, None if past_key_values is None else past_key_values.model_state(),
                         targets=targets, loss_mask=loss_mask)
        cache = None
        if use_cache:
            cache = past_key_values if past_key_values is not None else TransformerVQCache(len(self.model.units))
            cache.set_model_state(out.state)
        return CausalLMOutputWithPast(loss=out.loss, logits=out.logits, past_key_values=cache)


# exist_ok: registering the same classes again (e.g. after importlib.reload) is harmless
AutoConfig.register(MODEL_TYPE, TransformerVQHFConfig, exist_ok=True)
AutoModel.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)


def shifted_targets(labels: torch.LongTensor) -> tuple[torch.LongTensor, torch.Tensor]:
    """``(targets, loss_mask)`` for the library's model from ``transformers`` labels: position t's target is label
    t + 1; the last position and labels of -100 have none (masked, with a placeholder id 0)."""
    if labels.dim() != 2:
        raise ValueError(f"labels must be [batch, length], got shape {tuple(labels.shape)}")
    next_labels = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)
    loss_mask = next_labels != IGNORE_INDEX
    return next_labels.masked_fill(~loss_mask, 0), loss_mask
