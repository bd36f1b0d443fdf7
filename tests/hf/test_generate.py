"""`generate` of the transformers model against the library's own: the same logits, the same greedy tokens, the
same sampled tokens under the same seed, and a carried state whose size does not grow with the context."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hfutil import tiny_model  # noqa: E402
from transformer_vq.hf import TransformerVQCache, TransformerVQForCausalLM  # noqa: E402
from transformer_vq.hf.modeling import CACHE_FIELD  # noqa: E402

BLOCK = 8  # the tiny preset's block_len: 40 new tokens cross five blocks


@pytest.fixture(params=["vq", "vq-mha", "flash", "vq-qk"])
def pair(request):
    overrides = {"vq": {}, "vq-mha": dict(head_type="mha", n_head=2), "flash": dict(attn_type="flash",
                                                                                   flash_chunk_len=4),
                 "vq-qk": dict(quantize_queries=True)}
    lib = tiny_model(**overrides[request.param])
    return lib, TransformerVQForCausalLM.from_library_model(lib).eval()


def prompt(batch: int = 2, length: int = 5) -> torch.Tensor:
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(1))


def test_logits_equal_the_library(pair):
    lib, hf = pair
    x = prompt(length=21)
    assert torch.equal(hf(x).logits, lib(x).logits)


def test_greedy_generate_gives_the_library_tokens(pair):
    lib, hf = pair
    x = prompt()
    ref = lib.generate(x, 40, temperature=0)
    got = hf.generate(x, max_new_tokens=40, do_sample=False)
    assert torch.equal(got, ref)
    assert len(set(got[0, 5:].tolist())) > 1  # not a degenerate constant run that any model would match


@pytest.mark.parametrize("options", [dict(temperature=1.0), dict(temperature=0.7, top_k=10),
                                     dict(temperature=1.3, top_p=0.8)], ids=["plain", "top_k", "top_p"])
def test_seeded_sampling_gives_the_library_tokens(options):
    """Both draw with torch.multinomial from the default generator on the same float32 probabilities, so the same
    seed gives the same tokens. transformers samples among the 50 most likely tokens unless told otherwise: top_k=0
    is the library's top_k=None."""
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt()
    torch.manual_seed(7)
    ref = lib.generate(x, 3 * BLOCK, **options)
    torch.manual_seed(7)
    got = hf.generate(x, max_new_tokens=3 * BLOCK, do_sample=True, **{"top_k": 0, **options})
    assert torch.equal(got, ref)
    torch.manual_seed(8)
    assert not torch.equal(lib.generate(x, 3 * BLOCK, **options), ref)  # the seed matters: the check can fail


def test_generate_and_the_pipeline_sample_as_the_library_with_no_settings_given(tmp_path):
    """The model's generation config is the library's sampling (temperature 1, every token), so a plain
    ``generate(ids)`` and the text-generation pipeline, whose own defaults are top_k 50 and temperature 0.7, draw the
    tokens ``TransformerVQ.generate(ids)`` draws. Saved, that config travels in generation_config.json."""
    from transformers import AutoModelForCausalLM, pipeline

    from transformer_vq.data.codec import decode_bytes
    from transformer_vq.hf.export import save_hf

    lib = tiny_model(vocab_size=256)
    save_hf(lib, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    x = torch.tensor([list(b"ROMEO:")])
    torch.manual_seed(3)
    ref = lib.generate(x, 3 * BLOCK)
    torch.manual_seed(3)
    assert torch.equal(hf.generate(x, max_new_tokens=3 * BLOCK), ref)
    # transformers 5.0-5.15 let the pipeline's temperature 0.7 win over a model's 1.0 (5.18 on honour it)
    old = tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 18)
    pipe = pipeline("text-generation", model=hf, tokenizer=str(tmp_path))
    torch.manual_seed(3)
    text = pipe("ROMEO:", max_new_tokens=3 * BLOCK, **(dict(temperature=1.0) if old else {}))[0]["generated_text"]
    assert text == decode_bytes(ref[0].tolist())
    torch.manual_seed(4)
    assert not torch.equal(hf.generate(x, max_new_tokens=3 * BLOCK), ref)  # the seed matters: the check can fail
    assert torch.equal(hf.generate(x, max_new_tokens=3 * BLOCK, do_sample=False), lib.generate(x, 3 * BLOCK,
                                                                                                temperature=0))


def test_an_older_export_is_greedy_and_beam_search_is_do_sample_false(tmp_path):
    """What docs/huggingface.md says of a directory exported before the generation config held the library's
    decoding (transformers' defaults: a greedy ``generate(ids)``), and of beams under the exported ``do_sample=True``
    (beam sampling: ``do_sample=False`` is the deterministic search)."""
    import json

    from transformers import AutoModelForCausalLM

    from transformer_vq.hf.export import save_hf

    lib = tiny_model(vocab_size=256)
    save_hf(lib, tmp_path)
    x = torch.tensor([list(b"ROMEO:")])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    beams = [hf.generate(x, max_new_tokens=BLOCK, num_beams=3, do_sample=False) for _ in range(2)]
    assert torch.equal(*beams)
    sampled = []
    for seed in range(3):
        torch.manual_seed(seed)
        sampled.append(hf.generate(x, max_new_tokens=BLOCK, num_beams=3))
    assert any(not torch.equal(s, sampled[0]) for s in sampled[1:])  # beam sampling: the seed matters
    path = tmp_path / "generation_config.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in saved.items() if k not in ("do_sample", "temperature", "top_k",
                                                                             "top_p")}))
    older = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    torch.manual_seed(5)
    assert torch.equal(older.generate(x, max_new_tokens=BLOCK), lib.generate(x, BLOCK, temperature=0))


def test_prompt_read_once_then_one_token_per_step():
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    lengths = []
    hook = hf.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    try:
        hf.generate(prompt(length=11), max_new_tokens=6, do_sample=False)
    finally:
        hook.remove()
    assert lengths == [11, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("new_tokens", [3 * BLOCK, 5 * BLOCK, 9 * BLOCK])
def test_cache_size_stays_bounded(new_tokens):
    """Contexts of 3, 5 and 9 blocks hold the same number of bytes (the same phase in the block)."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    out = hf.generate(prompt(length=BLOCK), max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
    cache = out.past_key_values
    assert isinstance(cache, TransformerVQCache)
    assert cache.get_seq_length() == BLOCK + new_tokens - 1  # the last token is returned, never fed back
    # per unit (G=1, S=8, Dk=16, Dv=64): counts 8*4 + means 8*64*4 + window of 2L-1 = 15 keys (16+64)*4 + codes 15*8
    # + their document starts 15*1 (packed documents)
    assert cache.nbytes() == 2 * 2 * (8 * 4 + 8 * 64 * 4 + 15 * (16 + 64) * 4 + 15 * 8 + 15)


def test_several_samples_per_prompt_repeat_the_state():
    """num_return_sequences repeats each row of the cache (batch_repeat_interleave)."""
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt()
    torch.manual_seed(3)
    got = hf.generate(x, max_new_tokens=20, do_sample=True, top_k=0, num_return_sequences=2)
    torch.manual_seed(3)
    ref = lib.generate(x.repeat_interleave(2, dim=0), 20)
    assert torch.equal(got, ref)


def test_a_beam_search_cache_is_not_continued_and_the_refusal_says_why():
    """Beam search's cache holds its beams, not the sequences it returns: continuing them is refused, saying so."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    out = hf.generate(prompt(batch=1), max_new_tokens=4, num_beams=3, do_sample=False, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="the cache holds 3 rows, input_ids 1: .*beam search holds its num_beams"):
        hf.generate(out.sequences, max_new_tokens=2, do_sample=False, **{CACHE_FIELD: getattr(out, CACHE_FIELD)})


def test_cache_continues_a_sequence():
    """A cache passed back continues the same sequences, as the library's state does."""
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(length=19)
    first = hf(x[:, :12])
    ref = lib(x[:, 12:], lib(x[:, :12]).state).logits
    assert torch.equal(hf(x[:, 12:], past_key_values=first.past_key_values).logits, ref)


def test_labels_give_the_library_loss():
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(length=17)
    labels = x.clone()
    labels[:, :3] = -100
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, :2] = False
    mask[:, -1] = False
    targets = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
    ref = lib(x, targets=targets, loss_mask=mask)
    assert torch.equal(hf(x, labels=labels).loss, ref.loss)


def test_bad_inputs_are_refused():
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    x = prompt()
    from transformers import DynamicCache

    with pytest.raises(ValueError, match="must be a TransformerVQCache"):
        hf(x, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="must be a TransformerVQCache"):
        hf(x, cache=DynamicCache())
    cache = hf(x).past_key_values
    with pytest.raises(ValueError, match="cannot drop tokens"):
        cache.crop(1 if "tokens_to_remove" in str(inspect.signature(cache.crop)) else 4)
    with pytest.raises(ValueError, match="not both"):
        hf(x, cache=cache, past_key_values=hf(x).past_key_values)
    with pytest.raises(ValueError, match="output_attentions is not supported"):
        hf(x, output_attentions=True)
    with pytest.raises(TypeError, match=r"does not take \['colour'\]"):
        hf(x, colour="blue")
    with pytest.raises(ValueError, match="attention_mask must be"):
        hf(x, attention_mask=torch.ones(2, 1, 5, 5))


def test_the_cache_reaches_the_model_under_either_name():
    """transformers before 5.24 passes `past_key_values`, later ones `cache`: both continue the sequence."""
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(length=13)
    ref = lib(x[:, 9:], lib(x[:, :9]).state).logits
    for name in ("cache", "past_key_values"):
        first = hf(x[:, :9])
        assert torch.equal(hf(x[:, 9:], **{name: first.past_key_values}).logits, ref)


@pytest.mark.parametrize("says", ["attention_mask", "cache_position", "position_ids"])
def test_a_continuation_without_its_state_is_refused(says):
    """Positions that say the call continues a sequence, and no state: an error, never logits from an empty state."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    x = prompt(length=6)
    given = {"attention_mask": dict(attention_mask=torch.ones(2, 7, dtype=torch.long)),
             "cache_position": dict(cache_position=torch.tensor([6])),
             "position_ids": dict(position_ids=torch.tensor([[6], [6]]))}[says]
    with pytest.raises(ValueError, match="no state"):
        hf(x[:, -1:], **given)


def test_generate_with_a_cache_keyword_the_model_does_not_know_fails_loudly(monkeypatch):
    """A transformers that renames the cache keyword again must meet an error, not produce wrong tokens."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    prepare = type(hf).prepare_inputs_for_generation

    def renamed(self, *args, **kwargs):
        inputs = prepare(self, *args, **kwargs)
        for name in ("cache", "past_key_values"):
            if inputs.get(name) is not None:
                inputs["layer_state"] = inputs.pop(name)
        return inputs

    monkeypatch.setattr(type(hf), "prepare_inputs_for_generation", renamed)
    with pytest.raises(ValueError, match=r"keyword\(s\) \['layer_state'\]"):
        hf.generate(prompt(), max_new_tokens=4, do_sample=False)


def test_generate_whose_cache_never_arrives_fails_loudly(monkeypatch):
    """The case of transformers 5.24 against the old model: the cache dropped on the way, the mask still growing."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    prepare = type(hf).prepare_inputs_for_generation

    def dropped(self, *args, **kwargs):
        inputs = prepare(self, *args, **kwargs)
        inputs.pop("cache", None), inputs.pop("past_key_values", None)
        return inputs

    monkeypatch.setattr(type(hf), "prepare_inputs_for_generation", dropped)
    with pytest.raises(ValueError, match="no state"):
        hf.generate(prompt(), max_new_tokens=4, do_sample=False, attention_mask=torch.ones(2, 5, dtype=torch.long))


def test_generate_continued_from_the_new_tokens_alone_says_to_pass_the_whole_sequence():
    """generate with a cache wants the whole sequence; given the new tokens alone it kept none of them, and the
    refusal spoke of position_ids."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    out = hf.generate(prompt(), max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    with pytest.raises(ValueError, match=r"pass the whole sequence \(past and new tokens, e.g. out.sequences\)"):
        hf.generate(out.sequences[:, -1:], **{CACHE_FIELD: out.past_key_values}, max_new_tokens=2, do_sample=False)


def test_generate_stops_at_a_nul_only_when_told():
    """docs/huggingface.md: the model names no end-of-text token, so generate runs on through NULs (only lm-eval,
    reading the tokenizer's, stops there); eos_token_id=0 stops it."""
    lib = tiny_model()
    with torch.no_grad():  # a head that predicts NUL at every step
        lib.head.weight.zero_()
        lib.head.bias.zero_()
        lib.head.bias[0] = 10.0
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(batch=1)
    assert hf.generation_config.eos_token_id is None
    assert hf.generate(x, max_new_tokens=4, do_sample=False)[0, 5:].tolist() == [0, 0, 0, 0]
    assert hf.generate(x, max_new_tokens=4, do_sample=False, eos_token_id=0)[0, 5:].tolist() == [0]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generate_with_and_without_cache(batch, use_cache):
    """Without a cache, generate feeds the whole sequence each step: the same tokens, at quadratic cost."""
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(batch=batch, length=7)
    ref = lib.generate(x, 2 * BLOCK + 3, temperature=0)
    got = hf.generate(x, max_new_tokens=2 * BLOCK + 3, do_sample=False, use_cache=use_cache)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("batch", [1, 3])
def test_seeded_sampling_batch_sizes(batch):
    lib = tiny_model()
    hf = TransformerVQForCausalLM.from_library_model(lib).eval()
    x = prompt(batch=batch, length=6)
    torch.manual_seed(11)
    ref = lib.generate(x, 2 * BLOCK, temperature=0.9)
    torch.manual_seed(11)
    assert torch.equal(hf.generate(x, max_new_tokens=2 * BLOCK, do_sample=True, top_k=0, temperature=0.9), ref)


def test_logits_to_keep():
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    x = prompt(length=9)
    full = hf(x).logits
    assert torch.equal(hf(x, logits_to_keep=1).logits, full[:, -1:])
    assert torch.equal(hf(x, logits_to_keep=torch.tensor([0, 4])).logits, full[:, [0, 4]])
