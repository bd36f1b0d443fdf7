"""What a transformers user passes to ``generate`` and ``forward`` is honoured or refused with its reason, never
silently ignored (found by a new user's audit): ``stop_strings`` (generate hands forward its tokenizer),
``return_dict=False``, ``head_mask`` / ``token_type_ids``, a cache with positions that restart, a padded batch
continued with its mask, assisted decoding, and errors about ``labels`` that name them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from hfutil import tiny_model  # noqa: E402
from transformer_vq.hf import TransformerVQForCausalLM  # noqa: E402
from transformer_vq.hf.modeling import CACHE_FIELD  # noqa: E402


def hf_model():
    return TransformerVQForCausalLM.from_library_model(tiny_model().double()).eval()


def ids(batch=2, length=11, seed=3):
    return torch.randint(1, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_stop_strings_with_a_tokenizer(exported):
    """generate passes forward the tokenizer its stopping criteria read; forward refused it, so stop_strings (and the
    pipeline's stop_sequence) crashed."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(exported), AutoTokenizer.from_pretrained(exported)
    prompt = tokenizer("the king", return_tensors="pt").input_ids
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(plain[0, prompt.shape[1]:])
    stop = text[2:4] if len(text) >= 4 else text  # a string the greedy continuation is sure to produce
    stopped = model.generate(prompt, max_new_tokens=12, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    assert stopped.shape[1] <= plain.shape[1] and torch.equal(stopped[0], plain[0, :stopped.shape[1]])
    assert stop in tokenizer.decode(stopped[0, prompt.shape[1]:])


def test_return_dict_false_returns_a_tuple():
    model, x = hf_model(), ids()
    out = model(x, labels=x)
    loss, logits, cache = model(x, labels=x, return_dict=False)
    assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits) and cache.get_seq_length() == x.shape[1]
    model.config.return_dict = False
    assert isinstance(model(x), tuple)


@pytest.mark.parametrize("name, value, why", [
    ("head_mask", torch.zeros(2, 1), "no per-head masks"), ("token_type_ids", torch.ones(2, 11, dtype=torch.long),
                                                            "no token types")])
def test_options_it_cannot_honour_are_refused_when_set(name, value, why):
    model, x = hf_model(), ids()
    with pytest.raises(ValueError, match=rf"^{name} is not supported: .*{why}"):
        model(x, **{name: value})
    model(x, **{name: None})  # off: as transformers passes it


def test_a_cache_with_positions_restarting_at_zero_is_refused():
    """The cache and the mask say "continue", the positions "start anew": the logits were read from an empty
    state without a word."""
    model, x = hf_model(), ids(length=19)
    first = model(x[:, :11])
    mask = torch.ones(2, 19, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^row 0: position_ids restart at 0, but its attention_mask marks earlier "
                                         r"columns real and the cache holds 11 tokens of it"):
        model(x[:, 11:], past_key_values=first.past_key_values, attention_mask=mask,
              position_ids=torch.arange(8).expand(2, 8))
    again = model(x[:, 11:], past_key_values=first.past_key_values, attention_mask=mask,
                  position_ids=torch.arange(11, 19).expand(2, 8))
    torch.testing.assert_close(again.logits, model(x).logits[:, 11:], rtol=0, atol=1e-12)


def test_a_padded_batch_continues_with_its_mask():
    model = hf_model()
    x, mask = ids(), torch.ones(2, 11, dtype=torch.long)
    x[1, :4], mask[1, :4] = 0, 0  # row 1 left-padded
    out = model.generate(x, attention_mask=mask, max_new_tokens=5, do_sample=False, return_dict_in_generate=True,
                         pad_token_id=0)
    whole = torch.cat([mask, torch.ones_like(out.sequences[:, 11:])], dim=1)
    more = model.generate(out.sequences, attention_mask=whole, **{CACHE_FIELD: out.past_key_values}, max_new_tokens=4,
                          do_sample=False, pad_token_id=0)
    at_once = model.generate(x, attention_mask=mask, max_new_tokens=9, do_sample=False, pad_token_id=0)
    assert torch.equal(more, at_once)


def test_one_output_continued_twice_needs_a_copy_of_the_cache_per_branch():
    """A cache is advanced in place by every call that continues it: a second branch from the same ``out.cache`` is
    refused with how to branch (a copy per branch), even where its sequence is long enough to pass the column count
    (it ran, silently, from a state built on the first branch's tokens); with a copy each, each branch is the
    generation of its whole sequence from nothing."""
    import copy

    model = hf_model()
    out = model.generate(ids(), max_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    spare = copy.deepcopy(out.past_key_values)
    first = model.generate(out.sequences, **{CACHE_FIELD: out.past_key_values}, max_new_tokens=4, do_sample=False)
    assert torch.equal(first, model.generate(out.sequences, max_new_tokens=4, do_sample=False))
    branch_advice = r"\. A cache is advanced in place .* own copy \(copy.deepcopy\(out.cache\)\)$"
    with pytest.raises(ValueError, match=r"^input_ids has 16 columns, fewer than the 19 this cache consumed: pass "
                                         r"the whole sequence .*" + branch_advice):
        model.generate(out.sequences, **{CACHE_FIELD: out.past_key_values}, max_new_tokens=4, do_sample=False)
    other = torch.cat([out.sequences, torch.full((2, 6), 7)], dim=1)  # 22 columns, past the 19 consumed
    with pytest.raises(ValueError, match=r"^the first 19 columns of input_ids are not the ones this cache consumed "
                                         r"\(rows \[0, 1\]\)" + branch_advice):
        model.generate(other, **{CACHE_FIELD: out.past_key_values}, max_new_tokens=3, do_sample=False)
    with pytest.raises(ValueError, match=r"^the first 19 columns"):  # the sequence named as transformers names it
        model.generate(inputs=other, **{CACHE_FIELD: out.past_key_values}, max_new_tokens=3, do_sample=False)
    branch = model.generate(other, **{CACHE_FIELD: spare}, max_new_tokens=3, do_sample=False)
    assert torch.equal(branch, model.generate(other, max_new_tokens=3, do_sample=False))


def test_a_fingerprint_of_columns_read_at_once_is_that_of_the_columns_read_one_by_one():
    from transformer_vq.hf.cache import fingerprint

    x = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(0))
    stepwise = None
    for column in x.split(1, dim=1):
        stepwise = fingerprint(column, stepwise)
    assert torch.equal(fingerprint(x), stepwise)
    assert torch.equal(fingerprint(x[:, 25:], fingerprint(x[:, :25])), stepwise)
    assert not torch.equal(fingerprint(x.flip(1)), stepwise)


def test_assisted_decoding_is_refused_with_its_reason():
    model = hf_model()
    with pytest.raises(ValueError, match=r"^assisted decoding \(prompt_lookup_num_tokens\) is not supported: it "
                                         r"rolls the cache back"):
        model.generate(ids(), max_new_tokens=3, do_sample=False, prompt_lookup_num_tokens=2)


def test_bad_labels_are_named_labels():
    model, x = hf_model(), ids()
    with pytest.raises(ValueError, match=r"^labels must have the shape of input_ids \(2, 11\) \(one target per input "
                                         r"position\), got \(2, 10\)$"):
        model(x, labels=x[:, 1:])
    with pytest.raises(ValueError, match=r"^labels must be a \[batch, length\] int64 tensor"):
        model(x, labels=x.int())
    bad = x.clone()
    bad[0, 3] = 300
    with pytest.raises(ValueError, match=r"^labels holds token id 300, outside the vocabulary \[0, 64\) "
                                         r"\(and not -100"):
        model(x, labels=bad)
    ignored = x.clone()
    ignored[:, :3] = -100
    model(x, labels=ignored)
