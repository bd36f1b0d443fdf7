"""Padded and packed batches through the transformers model: every sequence gets the logits, tokens, state and
codebook statistics it gets alone (float64, so that batching different rows together changes nothing beyond
rounding)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hfutil import tiny_model  # noqa: E402
from transformer_vq.hf import TransformerVQForCausalLM  # noqa: E402

BLOCK = 8
LENGTHS = (3, 9, 12, 17)  # inside the first block, across one boundary, across two
TOL = dict(rtol=0, atol=1e-12)


def pair(**overrides):
    lib = tiny_model(**overrides).double()
    return lib, TransformerVQForCausalLM.from_library_model(lib).eval()


def prompts(lengths=LENGTHS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 64, (n,), generator=g) for n in lengths]


def padded(seqs: list[torch.Tensor], side: str, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, max], attention_mask [B, max])`` with the padding on ``side``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[row, cols], mask[row, cols] = s, 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["vq", "flash", "full", "vq-qk"])
def test_padded_logits_equal_each_sequence_alone(side, kind):
    overrides = {"vq": {}, "flash": dict(attn_type="flash", flash_chunk_len=4), "full": dict(attn_type="full"),
                 "vq-qk": dict(quantize_queries=True)}[kind]
    lib, hf = pair(**overrides)
    seqs = prompts()
    ids, mask = padded(seqs, side)
    logits = hf(ids, attention_mask=mask).logits
    for row, s in enumerate(seqs):
        alone = lib(s[None]).logits[0]
        assert torch.allclose(logits[row, mask[row].bool()], alone, **TOL)
        real = mask[row].bool().nonzero().flatten()
        if side == "left":  # nothing real before: zeros, not a made-up prediction
            assert not logits[row, :real[0]].any()
        else:  # after the sequence: its last prediction, what transformers reads at the last column
            assert torch.equal(logits[row, real[-1] + 1:], logits[row, real[-1]].expand_as(logits[row, real[-1] + 1:]))


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_state_continues_each_sequence_as_alone(side):
    """The carried state of every row is its own sequence's: the next tokens get the logits they get alone."""
    lib, hf = pair()
    seqs = prompts()
    ids, mask = padded(seqs, side)
    first = hf(ids, attention_mask=mask)
    assert first.past_key_values.offsets() == list(LENGTHS)
    assert first.past_key_values.get_seq_length() == ids.shape[1]  # transformers counts columns, padding included
    nxt = torch.randint(0, 64, (len(seqs), 11), generator=torch.Generator().manual_seed(5))
    full_mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    logits = hf(nxt, attention_mask=full_mask, cache=first.past_key_values).logits
    for row, s in enumerate(seqs):
        alone = lib(nxt[row:row + 1], lib(s[None]).state).logits[0]
        assert torch.allclose(logits[row], alone, **TOL)


def test_left_padded_batched_generation_gives_each_prompt_its_own_tokens():
    lib, hf = pair()
    seqs = prompts()
    ids, mask = padded(seqs, "left")
    got = hf.generate(ids, attention_mask=mask, max_new_tokens=3 * BLOCK, do_sample=False, pad_token_id=0)
    for row, s in enumerate(seqs):
        alone = lib.generate(s[None], 3 * BLOCK, temperature=0)[0, len(s):]
        assert torch.equal(got[row, ids.shape[1]:], alone)
    assert len(set(got[:, ids.shape[1]:].flatten().tolist())) > 3  # not a constant run any model would match


def test_right_padded_generation_continues_each_prompt_or_says_why_not():
    """transformers before 5.24 passes no position_ids: the last column's logits (carried over the padding) predict
    each row's next token, and the new tokens continue the real ones. 5.24 counts the padding into the positions it
    passes, which contradicts the row's state: refused, with the remedy."""
    lib, hf = pair()
    seqs = prompts((3, 9, 12))
    ids, mask = padded(seqs, "right")
    try:
        got = hf.generate(ids, attention_mask=mask, max_new_tokens=2 * BLOCK, do_sample=False, pad_token_id=0)
    except ValueError as err:
        assert "pad prompts on the left" in str(err)
        return
    for row, s in enumerate(seqs):
        assert torch.equal(got[row, ids.shape[1]:], lib.generate(s[None], 2 * BLOCK, temperature=0)[0, len(s):])


def test_right_padded_loss_is_the_mean_over_every_sequences_targets():
    lib, hf = pair()
    seqs = prompts()
    ids, mask = padded(seqs, "right")
    labels = ids.masked_fill(mask == 0, -100)
    out = hf(ids, attention_mask=mask, labels=labels)
    ce_sum = n_targets = commit_sum = n_tokens = 0
    for s in seqs:
        alone = lib(s[None, :-1], targets=s[None, 1:])
        ce_sum, n_targets = ce_sum + alone.ce_loss * (len(s) - 1), n_targets + len(s) - 1
        commit_sum, n_tokens = commit_sum + lib(s[None]).commit_loss * len(s), n_tokens + len(s)
    ref = ce_sum / n_targets + lib.cfg.commit_coef * commit_sum / n_tokens
    assert torch.allclose(out.loss, ref.to(out.loss.dtype), rtol=1e-12, atol=0)


def test_padding_never_enters_the_codebook_statistics():
    """In training mode, the quantizers accumulate exactly the statistics of the real tokens."""
    lib, hf = pair()
    seqs = prompts()
    ids, mask = padded(seqs, "left", pad_id=5)
    hf.train()
    hf(ids, attention_mask=mask)
    got = [t.clone() for t in hf.model.codebook_stats()]
    lib.train()
    lib.reset_codebook_stats()
    for s in seqs:
        lib(s[None])
    for a, b in zip(got, lib.codebook_stats()):
        assert torch.allclose(a, b.to(a.dtype), **TOL)


def test_packed_documents_equal_each_document_alone():
    """position_ids that restart at 0 (transformers' DataCollatorWithFlattening) split a row into sequences: no
    token attends across a boundary, and no loss predicts one document's first token from the last one."""
    lib, hf = pair()
    docs = prompts((5, 11, 1, 9))
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    labels = ids.clone()
    out = hf(ids, position_ids=positions, labels=labels)
    start = 0
    ce_sum = n_targets = 0
    for d in docs:
        alone = lib(d[None]).logits[0]
        assert torch.allclose(out.logits[0, start:start + len(d)], alone, **TOL)
        if len(d) > 1:
            ce = lib(d[None, :-1], targets=d[None, 1:]).ce_loss
            ce_sum, n_targets = ce_sum + ce * (len(d) - 1), n_targets + len(d) - 1
        start += len(d)
    ce_ref = ce_sum / n_targets
    commit = sum(lib(d[None]).commit_loss * len(d) for d in docs) / sum(len(d) for d in docs)
    assert torch.allclose(out.loss, ce_ref + lib.cfg.commit_coef * commit, rtol=1e-12, atol=0)
    # the state carried out of the row is its last document's
    assert out.past_key_values.offsets() == [len(docs[-1])]


def test_positions_that_skip_are_refused():
    _, hf = pair()
    ids = prompts((6,))[0][None]
    with pytest.raises(ValueError, match="must count up by one"):
        hf(ids, position_ids=torch.tensor([[0, 1, 2, 4, 5, 6]]))


def test_an_all_padding_call_is_refused():
    _, hf = pair()
    with pytest.raises(ValueError, match="holds no real token"):
        hf(torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.zeros(2, 3, dtype=torch.long))


def test_a_generation_with_a_row_of_padding_alone_is_refused_naming_the_row():
    """An empty prompt among others (``tok(["", "ROMEO:"], padding=True)``): nothing conditions the row's first token,
    as for an empty prompt alone. It drew from all-zero logits and failed a step later, blaming the cache."""
    _, hf = pair()
    ids, mask = padded(prompts((4, 6)), "left")
    mask[0] = 0
    with pytest.raises(ValueError, match="row 0 of the batch holds no real token"):
        hf.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    mask[1] = 0
    with pytest.raises(ValueError, match="rows 0, 1 of the batch hold no real token"):
        hf.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
