"""The checks and the plan of one call of :class:`~transformer_vq.hf.modeling.TransformerVQForCausalLM`: the cache
under whichever keyword it came, the keywords refused with their reason, and the call's columns, rows and positions
checked against the cache and cut into the segments each row's real tokens run as. ``forward`` and ``generate`` call
these before any work, so a call the model cannot honour is refused with why rather than computed wrong."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from transformer_vq.hf.cache import TransformerVQCache
from transformer_vq.models.tvq.ragged import RowStates, plan_segments
from transformer_vq.ops.documents import FLATTENING_KEYS, flattened_positions


def resolve_cache(cache, past_key_values, kwargs: dict) -> TransformerVQCache | None:
    """The cache under whichever keyword it came. A ``transformers`` cache under a keyword this model does not know
    is refused by name: ignoring it would compute every step from an empty state and give wrong tokens silently."""
    unknown = sorted(name for name, value in kwargs.items() if isinstance(value, Cache))
    if unknown:
        raise ValueError(f"a cache arrived under the keyword(s) {unknown}, which TransformerVQForCausalLM does not "
                         f"know (it reads `cache` or `past_key_values`); this transformers version passes the state "
                         f"under a new name: please report it with the output of `tvq doctor`")
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("pass the cache once: as `cache` or as `past_key_values`, not both")
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, TransformerVQCache):
        raise ValueError(f"the cache must be a TransformerVQCache (or None), got {type(cache).__name__}; "
                         f"Transformer-VQ carries its attention state, not keys and values")
    return cache


# The refusal of generate(new_tokens, cache=...): generate runs the columns of input_ids past the cache's length, so
# of the new tokens alone it runs none (transformers 5.24 passes forward no column, 5.0 an empty cache_position).
NEW_TOKENS_ALONE = ("input_ids holds no token that the cache has not consumed: to continue with generate, pass the "
                    "whole sequence (past and new tokens, e.g. out.sequences) with the cache, not the new tokens alone")

# generate's options of assisted (speculative) decoding, which needs a cache that drops tokens.
ASSISTED = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")

# Keywords transformers may pass that change nothing here when false or None, each refused (with why) when set.
REFUSED_WHEN_SET = {
    "output_attentions": "the linear-time attention never forms the weights",
    "output_hidden_states": "use model.model.features(input_ids)[0] for the residual stream",
    "inputs_embeds": "the model reads token ids",
    "token_type_ids": "the model has no token types",
    "head_mask": "the model has no per-head masks (its attention is single-head per group, and the linear-time path "
                 "never forms the weights a mask would scale)",
}
# Keywords generate passes through to forward whatever their value, for its own use (the stopping criteria's
# tokenizer, stop_strings; the step counter): they say nothing about what forward computes.
PASSED_THROUGH = ("is_first_iteration", "tokenizer", "assistant_tokenizer")


def refuse_unsupported(input_ids, kwargs: dict) -> None:
    """Say why not, rather than ignore a request: attention weights and hidden states are never formed by the
    linear-time path, and the model reads token ids only."""
    if input_ids is None:
        raise ValueError("input_ids are required: the model reads token ids (inputs_embeds are not supported)")
    asked = {name: value for name, value in kwargs.items()
             if name not in (*PASSED_THROUGH, *FLATTENING_KEYS) and value is not None and value is not False}
    for name, why in REFUSED_WHEN_SET.items():
        if name in asked:
            raise ValueError(f"{name} is not supported: {why}")
    if asked:
        raise TypeError(f"TransformerVQForCausalLM.forward does not take {sorted(asked)}")


def refuse_empty_rows(attention_mask) -> None:
    """Refuse a generation from a row whose ``attention_mask`` is all 0: the model has no beginning-of-text token,
    so nothing conditions the row's first token, as for a lone empty prompt (refused by its length). Left to the
    steps, the first drew from all-zero logits and the second failed on the row's positions, blaming the cache."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or attention_mask.shape[1] == 0:
        return  # no mask, or one the forward call refuses with its own message
    empty = (attention_mask == 0).all(dim=1).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"row{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} of the batch "
                         f"{'hold' if len(empty) > 1 else 'holds'} no real token (attention_mask all 0): a "
                         f"Transformer-VQ model has no beginning-of-text token to start a sequence from nothing; "
                         f"give every prompt at least one token")


def plan_call(cache: TransformerVQCache | None, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
              position_ids: torch.Tensor | None, cache_position: torch.Tensor | None, kwargs: dict | None = None):
    """``(row states, columns the cache consumed, segments)`` of a forward call: its columns, rows and positions
    (or those DataCollatorWithFlattening's keys in ``kwargs`` imply) checked against the cache, then cut into the
    segments each row's real tokens run as (:func:`~transformer_vq.models.tvq.ragged.plan_segments`)."""
    B, T = input_ids.shape
    columns = 0 if cache is None else cache.get_seq_length()
    check_continuation(columns, T, attention_mask, cache_position)
    if cache is not None and cache.is_initialized and cache.batch_size != B:
        raise ValueError(f"the cache holds {cache.batch_size} rows, input_ids {B}: a cache continues the rows it "
                         f"read (one returned by beam search holds its num_beams beams per prompt, not the sequences "
                         f"returned: generate again from out.sequences without the cache)")
    rows = cache.rows if cache is not None and cache.rows is not None else RowStates(B)
    position_ids = flattened_positions(position_ids, kwargs or {}, B, T, mask=attention_mask, continued=columns,
                                       device=input_ids.device)
    check_restarts(attention_mask, position_ids, T, rows.offsets())
    mask = None if attention_mask is None else attention_mask[:, -T:]
    return rows, columns, plan_segments(rows.offsets(), T, mask=mask, positions=position_ids)


def check_continuation(columns: int, length: int, attention_mask: torch.Tensor | None,
                       cache_position: torch.Tensor | None) -> None:
    """Refuse a call whose columns contradict the cache: above all one that continues a sequence without its state."""
    if length == 0 and columns:  # what generate (5.24) runs of input_ids no longer than the cache: no column
        raise ValueError(NEW_TOKENS_ALONE)
    past = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be [batch, past + length] (2-D, zeros for padding), got shape "
                             f"{list(attention_mask.shape)}")
        if attention_mask.shape[1] < length:
            raise ValueError(f"attention_mask covers {attention_mask.shape[1]} columns, fewer than the "
                             f"{length} of input_ids")
        past, source = attention_mask.shape[1] - length, "attention_mask"
    if cache_position is not None:
        past, source = int(cache_position.reshape(-1)[0]), "cache_position"
    if past is None or past == columns:
        return
    if columns == 0:
        raise ValueError(f"this call continues sequences of {past} earlier columns ({source} says so) but no "
                         f"state of them arrived: pass the TransformerVQCache the previous call returned (as "
                         f"`cache` or `past_key_values`)")
    raise ValueError(f"{source} says {past} columns came before this call, but the cache has consumed {columns}")


def check_restarts(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, length: int,
                   offsets: list[int]) -> None:
    """Refuse a row that says both "continue" and "start anew": its state holds earlier tokens and its attention mask
    marks earlier columns real, yet its first token of this call is at position 0 (a new sequence, which would be
    read from an empty state while the cache and the mask said it continues)."""
    if position_ids is None or attention_mask is None or attention_mask.shape[1] <= length or not any(offsets):
        return
    now = attention_mask[:, -length:].bool()
    first = now.to(torch.int8).argmax(dim=1, keepdim=True)  # each row's first real column of this call
    restarts = now.any(dim=1) & (position_ids.gather(1, first).squeeze(1) == 0)
    continues = attention_mask[:, :-length].bool().any(dim=1) & torch.tensor([o > 0 for o in offsets],
                                                                             device=attention_mask.device)
    bad = (restarts & continues).nonzero()
    if len(bad):
        row = int(bad[0])
        raise ValueError(f"row {row}: position_ids restart at 0, but its attention_mask marks earlier columns real and "
                         f"the cache holds {offsets[row]} tokens of it; to start a new sequence, call without the "
                         f"cache (or mask the earlier columns out), to continue it, count its positions on from "
                         f"{offsets[row]}")
