"""Every form of transformers' ``DataCollatorWithFlattening`` through the transformers model: the flash-attention
keys (``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``) and ``seq_idx`` are read as the position_ids they imply, so
each form gives exactly (float64, bit for bit) the loss and logits of the default form (position_ids), which
tests/hf/test_padding.py holds to each document alone. What cannot be used, or disagrees, is refused with the remedy."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers")

from hfutil import tiny_model  # noqa: E402
from transformers import DataCollatorWithFlattening  # noqa: E402

from transformer_vq.hf import TransformerVQForCausalLM  # noqa: E402

LENGTHS = (5, 1, 9, 12)  # off the block grid (block_len 8), one of a single token, one across a block edge
REMEDY = "pass position_ids (DataCollatorWithFlattening's default)"
FORMS = [
    {"return_flash_attn_kwargs": True},
    {"return_seq_idx": True},
    {"return_flash_attn_kwargs": True, "return_seq_idx": True},
    {"return_position_ids": False, "return_flash_attn_kwargs": True},
    {"return_position_ids": False, "return_seq_idx": True},
    {"return_position_ids": False, "return_flash_attn_kwargs": True, "return_seq_idx": True},
]


@pytest.fixture(scope="module")
def hf():
    return TransformerVQForCausalLM.from_library_model(tiny_model().double()).eval()


def features(lengths=LENGTHS) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 64, (n,), generator=g).tolist()} for n in lengths]


@pytest.mark.parametrize("form", FORMS, ids=lambda form: ",".join(k if v else f"not-{k}" for k, v in form.items()))
def test_every_form_of_the_collator_gives_the_default_forms_loss_and_logits(hf, form):
    reference, batch = DataCollatorWithFlattening()(features()), DataCollatorWithFlattening(**form)(features())
    assert ("position_ids" in batch) == form.get("return_position_ids", True)
    assert {"cu_seq_lens_q", "seq_idx"} & set(batch)
    with torch.no_grad():
        want, got = hf(**reference), hf(**batch)
    assert torch.equal(got.logits, want.logits)
    assert torch.equal(got.loss, want.loss)
    assert got.past_key_values.offsets() == want.past_key_values.offsets() == [LENGTHS[-1]]


def flash_batch(**form) -> dict:
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True, **form)(features())


def refused(hf, batch: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(f"{message}; {REMEDY}") + "$"):
        hf(**batch)


def test_keys_that_disagree_are_refused_by_name(hf):
    batch = flash_batch()
    batch["cu_seq_lens_k"] = torch.tensor([0, 6, 15, 27], dtype=torch.int32)  # the first two documents as one
    refused(hf, batch, "position_ids and cu_seq_lens_k describe different documents: at row 0, column 5, position_ids "
                       "says position 0, cu_seq_lens_k 5")
    batch = flash_batch(return_position_ids=False)
    batch["cu_seq_lens_k"] = torch.tensor([0, 6, 15, 27], dtype=torch.int32)
    refused(hf, batch, "cu_seq_lens_q and cu_seq_lens_k describe different documents: at row 0, column 5, "
                       "cu_seq_lens_q says position 0, cu_seq_lens_k 5")
    batch = flash_batch()
    batch["seq_idx"] = torch.zeros_like(batch["seq_idx"])  # one document
    refused(hf, batch, "position_ids and seq_idx describe different documents: at row 0, column 5, position_ids says "
                       "position 0, seq_idx 5")
    batch = flash_batch()
    batch["position_ids"] = torch.arange(sum(LENGTHS))[None]
    refused(hf, batch, "position_ids and cu_seq_lens_q describe different documents: at row 0, column 5, position_ids "
                       "says position 5, cu_seq_lens_q 0")


def test_unusable_keys_are_refused_with_the_remedy(hf):
    batch = flash_batch()
    batch["max_length_q"] = 9
    refused(hf, batch, "max_length_q must be an integer no smaller than the longest document (12 tokens), got 9")
    batch = flash_batch(return_position_ids=False)
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = [0, 5, 6, 15, 27]
    refused(hf, batch, "cu_seq_lens_q must be a torch integer tensor, got list (torch.as_tensor converts it)")
    batch = flash_batch(return_position_ids=False)
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = torch.tensor([0, 5, 6, 15, 26], dtype=torch.int32)
    refused(hf, batch, "cu_seq_lens_q must increase strictly from 0 to B * T = 27, got [0, 5, 6, 15, 26]")
    batch = flash_batch()
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    batch["attention_mask"][0, -1] = 0
    refused(hf, batch, "cu_seq_lens_k, cu_seq_lens_q, max_length_k, max_length_q, seq_idx can only describe whole "
                       "documents of unpadded rows, but the attention mask holds padding")


def test_a_cache_cannot_be_continued_by_the_collators_keys(hf):
    first = hf(torch.arange(6)[None])
    batch = DataCollatorWithFlattening(return_position_ids=False, return_seq_idx=True)(features((2, 3)))
    with pytest.raises(ValueError, match=re.escape(f"seq_idx can only describe documents that begin in this call, "
                                                   f"but the cache continued holds 6 earlier tokens; {REMEDY}")):
        hf(**batch, cache=first.past_key_values)


def test_other_keys_are_still_refused_and_position_ids_checked_as_the_native_models(hf):
    ids = torch.arange(4)[None]
    with pytest.raises(TypeError, match=re.escape("does not take ['colour']")):
        hf(ids, colour="red")
    with pytest.raises(ValueError, match=re.escape("position_ids must be a torch integer tensor, got list")):
        hf(ids, position_ids=[[0, 1, 2, 3]])
    with pytest.raises(ValueError, match=re.escape("position_ids must be integers, got torch.bool")):
        hf(ids, position_ids=torch.ones(1, 4, dtype=torch.bool))
