"""The ``transformers`` causal language model of Transformer-VQ: the library's :class:`TransformerVQ` inside a
``PreTrainedModel`` (``save_pretrained`` / ``from_pretrained`` with safetensors) and ``GenerationMixin``
(``generate``), the VQ attention state carried between steps in a :class:`TransformerVQCache`.

The wrapper computes nothing itself: every logit comes from the wrapped module (``self.model``), so the math lives
in one place (``transformer_vq.models.tvq``). Its weights and EMA codebook buffers are saved under the same names as the
library's state dict, prefixed ``model.``.

``transformer_vq.hf`` registers these classes with the auto classes.
"""

from __future__ import annotations

import operator
import shutil
from pathlib import Path

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from transformer_vq.fileio import make_readable
from transformer_vq.hf.cache import TransformerVQCache
from transformer_vq.hf.calls import (ASSISTED, NEW_TOKENS_ALONE, plan_call, refuse_empty_rows, refuse_unsupported,
                                     resolve_cache)
from transformer_vq.hf.configuration import MODEL_FIELDS, TransformerVQHFConfig
from transformer_vq.models.tvq.gau import GatedAttentionUnit
from transformer_vq.models.tvq.model import TransformerVQ
from transformer_vq.models.tvq.ragged import run_segments
from transformer_vq.nn.inputs import IGNORE_INDEX, check_token_ids

# The remote code every saved directory carries (transformer_vq/hf/remote_code.py under the name transformers
# expects) and the auto classes config.json's auto_map sends to its classes: trust_remote_code=True loads the
# directory in a process that never imported transformer_vq.
REMOTE_CODE_SOURCE = Path(__file__).with_name("remote_code.py")
REMOTE_CODE_FILE = "modeling_transformer_vq.py"
AUTO_MAP = {auto: f"{Path(REMOTE_CODE_FILE).stem}.{cls}" for auto, cls in (
    ("AutoConfig", "TransformerVQHFConfig"), ("AutoModel", "TransformerVQForCausalLM"),
    ("AutoModelForCausalLM", "TransformerVQForCausalLM"))}
# What from_pretrained reports of tensors that do not fit; any of them refuses the load.
MISFIT_KINDS = ("missing_keys", "unexpected_keys", "mismatched_keys")
# The output field that carries the cache: `cache` from transformers 5.24 on, `past_key_values` before.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
# The library's model fields: those of a config that must equal the built model's (check_config).
FIELD_NAMES = tuple(f.name for f in MODEL_FIELDS)
built_fields = operator.attrgetter(*FIELD_NAMES)


def config_fields(config: TransformerVQHFConfig) -> tuple:
    """The model fields of ``config``, read past ``transformers``' ``__getattribute__``: its Python hooks cost about
    2 us a field, 50 us a decoded token for what forward checks every step (its attribute_map renames none of them)."""
    return tuple(map(object.__getattribute__, [config] * len(FIELD_NAMES), FIELD_NAMES))


class TransformerVQPreTrainedModel(PreTrainedModel):
    """What every ``transformers`` class of this model shares: its config class and how weights are initialized."""

    config_class = TransformerVQHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["GatedAttentionUnit"]
    # The loss is the library's mean (Eq. 35); transformers' Trainer must not hand forward a token count to
    # divide by (num_items_in_batch), which it does for a forward that takes **kwargs unless told so.
    accepts_loss_kwargs = False

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """``PreTrainedModel.from_pretrained``, refusing a directory that does not hold exactly this model's tensors.

        ``transformers`` reports missing tensors and carries on with freshly allocated ones: a missing EMA count came
        back as uninitialized memory and the logits as NaN. A model is loaded whole or not at all; the error lists
        every missing, unexpected and mis-shaped tensor.
        """
        want_info = kwargs.pop("output_loading_info", False)
        kwargs["ignore_mismatched_sizes"] = True  # report mis-shaped tensors with the others, then refuse them all
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        problems = {kind: sorted(str(entry[0] if isinstance(entry, tuple) else entry) for entry in info.get(kind) or ())
                    for kind in MISFIT_KINDS}
        if any(problems.values()):
            listed = "; ".join(f"{kind.replace('_', ' ')}: {', '.join(names)}"
                               for kind, names in problems.items() if names)
            raise ValueError(f"{args[0] if args else kwargs.get('pretrained_model_name_or_path')} does not hold this "
                             f"model's tensors ({listed}); it was saved from another model or damaged: export the "
                             f"run again with `tvq export --format hf`")
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``, plus what makes the directory stand alone: ``config.json``'s
        ``auto_map`` and the remote code it names, whether this model came from the library or from remote code.
        A config edited since the model was built is refused before anything is written (:meth:`check_config`)."""
        self.check_config()
        self.config.auto_map = dict(AUTO_MAP)
        result = super().save_pretrained(save_directory, *args, **kwargs)
        shutil.copyfile(REMOTE_CODE_SOURCE, Path(save_directory) / REMOTE_CODE_FILE)
        make_readable(save_directory)  # safetensors' owner-only weights, beside a readable config
        return result

    def check_config(self) -> None:
        """Refuse a config whose model fields differ from those the model was built with (``self.model.cfg``).

        The built model cannot follow an edit such as ``model.config.block_len = 4``: it would keep computing the old
        architecture, and ``save_pretrained`` would write the edited config beside its weights, a directory that
        loads as another model. ``forward`` and ``save_pretrained`` call this; the fields other than the library's
        (``use_cache``, ``dtype``, the ``output_*`` flags, ...) are ``transformers``' to change.
        """
        edited, built = config_fields(self.config), built_fields(self.model.cfg)
        if edited == built:
            return
        name, new, old = next((name, new, old) for name, new, old in zip(FIELD_NAMES, edited, built) if new != old)
        raise ValueError(f"config.{name} is {new!r} but this model was built with {name}={old!r}, which a built model "
                         f"cannot change: build a new model from the edited config (TransformerVQForCausalLM(config), "
                         f"or from_pretrained(directory, {name}={new!r}) for saved weights) or set it back")

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
        # Decoding as the library's generate decodes by default (sampling at temperature 1 among every token):
        # transformers' own defaults (greedy, top_k 50 when sampling, temperature 0.7 in the text-generation
        # pipeline) apply wherever a model's config is silent, and a seed would then give other tokens.
        self.generation_config.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        self.post_init()

    @classmethod
    def from_library_model(cls, model: TransformerVQ) -> "TransformerVQForCausalLM":
        """A ``transformers`` model holding a copy of ``model``'s weights and codebooks (same device and dtype)."""
        param = next(model.parameters())
        wrapped = cls(TransformerVQHFConfig.from_model_config(model.cfg)).to(device=param.device, dtype=param.dtype)
        wrapped.model.load_state_dict(model.state_dict())
        return wrapped.train(model.training)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, *args, **kwargs) -> dict:
        """``GenerationMixin``'s, refusing first the empty ``cache_position`` that transformers before 5.24 give
        ``generate(new_tokens, past_key_values=cache)`` and then fail on with an IndexError."""
        cache_position = kwargs.get("cache_position")
        if cache_position is not None and cache_position.numel() == 0:
            raise ValueError(NEW_TOKENS_ALONE)
        return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)

    def generate(self, *args, **kwargs):
        """``GenerationMixin.generate``, refusing first a cache that consumed other columns than the sequence's
        first (:meth:`TransformerVQCache.check_consumed`), a row of the batch without a real token
        (:func:`refuse_empty_rows`), and assisted decoding with its reason (transformers' own check says the model
        has no cache, which it has)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        input_ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
        if isinstance(cache, TransformerVQCache) and isinstance(input_ids, torch.Tensor):
            cache.check_consumed(input_ids)
        refuse_empty_rows(kwargs.get("attention_mask"))
        config = kwargs.get("generation_config")
        asked = [name for name in ASSISTED if kwargs.get(name) is not None or getattr(config, name, None) is not None]
        if asked:
            raise ValueError(f"assisted decoding ({', '.join(asked)}) is not supported: it rolls the cache back over "
                             f"the tokens it rejects, and a Transformer-VQ cache summarizes the keys older than its "
                             f"window per code, from which no token can be taken out")
        return super().generate(*args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not make a key/value cache: forward makes its own TransformerVQCache

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Linear | None:
        return self.model.head  # None when tied: the head is then a scaled product with the embedding

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> torch.nn.Embedding:
        """The token embedding when the size asked is the model's own; any other size is refused before anything
        changes (``transformers`` resized the embedding in place, then failed on the head, leaving a model that
        took ids its head cannot predict)."""
        wanted = self.model.cfg.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of:
            wanted = -(-wanted // pad_to_multiple_of) * pad_to_multiple_of
        if wanted != self.model.cfg.vocab_size:
            self.refuse_new_vocabulary(f"resize its token embeddings to {wanted}")
        return self.get_input_embeddings()

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.refuse_new_vocabulary("replace its token embedding")

    def set_output_embeddings(self, new_embeddings: torch.nn.Module) -> None:
        self.refuse_new_vocabulary("replace its output head")

    def refuse_new_vocabulary(self, change: str) -> None:
        """Say why ``change`` cannot be made: the library's model is built for one vocabulary size."""
        raise ValueError(f"TransformerVQForCausalLM cannot {change}: its vocabulary of {self.model.cfg.vocab_size} "
                         f"tokens is part of the trained architecture (embedding, output head, config.vocab_size); "
                         f"train a model with the vocabulary size you want (tvq train --vocab-size N) and export it "
                         f"(tvq export --format hf)")

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: TransformerVQCache | None = None,
                past_key_values: TransformerVQCache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """Next-token logits of ``input_ids`` ``[B, T]``, continuing the sequences of the cache.

        Args:
            cache: the cache a previous call returned, or ``None`` at the sequences' start. ``past_key_values`` is
                the same argument under the name transformers used before 5.24 (``generate`` passes whichever its
                version uses; give one, not both).
            attention_mask: ``[B, P + T]`` (``P`` columns consumed before), zero for padding. Padding is taken out
                before the model runs: each row's real tokens get exactly the logits, state and loss they get alone
                (``transformer_vq.models.tvq.ragged``), left padding, right padding or holes alike. A padded column
                holds the logits of its row's last real token before it (so the last column predicts what follows each
                row's sequence), zero before a row's first.
            position_ids: ``[B, T]`` (or ``[1, T]``) positions of the tokens in their own sequences. A token at
                position 0 starts a new sequence: packed documents (``DataCollatorWithFlattening``) are run as
                separate sequences. Every other position must continue the row's state. The collator's other keys
                (``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``, ``seq_idx``) come in ``kwargs``, read as the
                position_ids they imply (:func:`~transformer_vq.ops.documents.flattened_positions`).
            labels: ``[B, T]`` token ids, ``-100`` where no loss is wanted; a token's target is the label of the
                next real token of its sequence, as in ``transformers`` (position t predicts label t + 1) when there
                is no padding. The loss is the library's (cross-entropy plus ``commit_coef`` times the commitment
                loss, Eq. 35).
            use_cache: return the cache (default ``config.use_cache``).
            logits_to_keep: an int ``k > 0`` returns the logits of the last ``k`` columns only (``generate`` asks
                for 1); a 1-D tensor the logits of those columns; 0 every column.
            return_dict: ``False`` (or ``config.return_dict`` false): the tuple of the output's fields that are set,
                as transformers' own models return it.
            kwargs: ``cache_position``, the columns of these tokens (transformers before 5.24 pass it; not a
                named parameter, because 5.24 warns about remote-code models whose forward names it): must start at
                the cache's length. The false/None flags transformers passes are accepted (set, each is refused with
                its reason), and what ``generate`` hands on for its own use (its tokenizer, for ``stop_strings``) is
                passed by; anything else is refused.

        Raises ``ValueError`` when the inputs say this call continues a sequence (an attention mask longer than
        ``input_ids``, ``cache_position`` or ``position_ids`` past 0) and no cache of that length arrived: the model
        never computes a continuation from an empty state.
        """
        self.check_config()
        cache = resolve_cache(cache, past_key_values, kwargs)
        cache_position = kwargs.pop("cache_position", None)
        refuse_unsupported(input_ids, kwargs)
        if labels is not None:  # token ids or -100, named as the caller named them
            check_token_ids(labels, self.model.cfg.vocab_size, "labels", shape=input_ids.shape, ignore=IGNORE_INDEX)
        rows, columns, segments = plan_call(cache, input_ids, attention_mask, position_ids, cache_position, kwargs)
        out = run_segments(self.model, input_ids, segments, rows, labels=labels)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        new_cache = None
        if use_cache:
            new_cache = cache if cache is not None else TransformerVQCache(len(self.model.units))
            new_cache.set_rows(out.states, input_ids)
        output = CausalLMOutputWithPast(loss=out.loss, logits=kept_logits(out.logits, logits_to_keep),
                                        **{CACHE_FIELD: new_cache})
        # return_dict False (the argument, else the config's): the tuple of the set fields, as transformers' models
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()


def kept_logits(logits: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The columns ``logits_to_keep`` asks for (the last ``k``; 0: all)."""
    if isinstance(logits_to_keep, torch.Tensor):
        return logits[:, logits_to_keep]
    return logits if logits_to_keep == 0 else logits[:, -logits_to_keep:]
