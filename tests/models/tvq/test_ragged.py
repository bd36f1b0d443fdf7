"""Ragged batches in the library (no transformers): segment planning, per-row states, and run_segments against each
sequence run alone."""

from __future__ import annotations

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.models.tvq.ragged import RowStates, Segment, plan_segments, run_segments, select_rows


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TransformerVQ(preset("tiny", vocab_size=32)).double().eval()


def test_plan_takes_padding_out_and_splits_at_position_zero():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    positions = torch.tensor([[0, 0, 4, 5, 6], [0, 1, 2, 0, 0], [2, 0, 0, 1, 2]])
    got = plan_segments([4, 0, 2], 5, mask=mask, positions=positions)
    assert got == [Segment(0, (2, 3, 4), 4, True), Segment(1, (0, 1, 2), 0, True),
                   Segment(2, (0,), 2, False), Segment(2, (2, 3, 4), 0, True)]


def test_plan_without_positions_continues_every_row():
    assert plan_segments([3, 0], 2) == [Segment(0, (0, 1), 3, True), Segment(1, (0, 1), 0, True)]


@pytest.mark.parametrize("offsets, positions, message", [
    ([0], [[3, 4]], "continues a sequence of 3 earlier tokens, but no state"),
    ([5], [[3, 4]], "has consumed 5 tokens"),
    ([0], [[0, 2]], "must count up by one"),
])
def test_plan_refuses_positions_that_contradict_the_states(offsets, positions, message):
    with pytest.raises(ValueError, match=message):
        plan_segments(offsets, 2, positions=torch.tensor(positions))


def test_row_states_select_gather_and_replace(model):
    ids = torch.randint(0, 32, (3, 11), generator=torch.Generator().manual_seed(0))
    state = model(ids).state
    rows = RowStates.of(state, 3)
    assert rows.whole() is state and rows.offsets() == [11, 11, 11]
    assert rows.gather([0, 1, 2]) is state  # rows that ran together come back without a copy
    picked = rows.select([2, 2, 0])  # beam reordering / repetition
    logits = model(ids[[2, 2, 0], :3], picked.whole()).logits
    assert torch.equal(logits, model(ids[[2, 2, 0], :3], select_rows(state, [2, 2, 0])).logits)
    short = model(ids[:1, :4]).state
    mixed = rows.with_rows([1], short)
    assert mixed.offsets() == [11, 4, 11] and mixed.whole() is None
    assert torch.equal(mixed.gather([1]).layers[0].recent_k, short.layers[0].recent_k)
    with pytest.raises(ValueError, match="same offset"):
        mixed.gather([0, 1])



def test_rows_of_packed_and_plain_states_share_a_batch(model):
    """A row whose window may hold a document start (a packed call's state) and a plain row combine into one batch
    that still hides the packed row's earlier documents (the state's host-side flag, any of the rows)."""
    ids = torch.randint(0, 32, (2, 11), generator=torch.Generator().manual_seed(0))
    packed = model(ids[:1], position_ids=torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]])).state
    plain = model(ids[1:]).state
    assert packed.layers[0].documents and not plain.layers[0].documents
    both = RowStates(2, [((0,), packed), ((1,), plain)]).gather([0, 1])
    assert both.layers[0].documents and both.offset == 11
    more = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(1))
    logits = model(more, both).logits
    torch.testing.assert_close(logits[:1], model(more[:1], packed).logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1:], model(more[1:], plain).logits, rtol=1e-5, atol=1e-5)

def test_run_segments_equals_each_sequence_alone(model):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 32, (2, 13), generator=g)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[0, :6] = False  # row 0: 7 tokens after padding; row 1: all 13
    out = run_segments(model, ids, plan_segments([0, 0], 13, mask=mask), RowStates(2))
    assert torch.allclose(out.logits[0, 6:], model(ids[:1, 6:]).logits[0], rtol=0, atol=1e-12)
    assert torch.allclose(out.logits[1], model(ids[1:]).logits[0], rtol=0, atol=1e-12)
    assert out.states.offsets() == [7, 13]


def test_one_group_gives_the_models_own_numbers_bit_for_bit(model):
    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(4))
    out = run_segments(model, ids, plan_segments([0, 0], 9), RowStates(2), labels=ids)
    ref = model(ids, targets=torch.cat([ids[:, 1:], ids[:, :1]], 1),
                loss_mask=torch.arange(9).expand(2, 9) < 8)
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
