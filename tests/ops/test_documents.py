"""Document boundaries from either convention (cu_seqlens, position_ids) become one ``doc_start`` mask."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.ops.documents import (check_doc_start, document_positions, document_starts, flattened_positions,
                                          segment_ids, starts_from_seq_idx)


def test_cu_seqlens_and_position_ids_give_the_same_starts():
    # two rows of 6: documents of 2, 3, 1 tokens, then 4 and 2
    cu_seqlens = torch.tensor([0, 2, 5, 6, 10, 12], dtype=torch.int32)
    position_ids = torch.tensor([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]])
    want = torch.tensor([[1, 0, 1, 0, 0, 1], [1, 0, 0, 0, 1, 0]], dtype=torch.bool)
    assert torch.equal(document_starts(2, 6, cu_seqlens=cu_seqlens), want)
    assert torch.equal(document_starts(2, 6, position_ids=position_ids), want)
    assert torch.equal(segment_ids(want), torch.tensor([[1, 1, 2, 2, 2, 3], [1, 1, 1, 1, 2, 2]]))


def test_positions_that_do_not_start_at_zero_continue_a_document():
    starts = document_starts(1, 5, position_ids=torch.tensor([[7, 8, 0, 1, 2]]))
    assert starts.tolist() == [[False, False, True, False, False]]
    assert document_starts(1, 5) is None


@pytest.mark.parametrize("kwargs,message", [
    ({"position_ids": torch.tensor([[0, 1, 3]])},
     "position_ids of row 0 go from 1 to 3 at column 2: within a document they count up by one, and a new document "
     "restarts at 0"),
    ({"position_ids": torch.tensor([[0, 1]])}, "position_ids must be [B, T] = [1, 3], got [1, 2]"),
    ({"position_ids": torch.tensor([[0.0, 1.0, 2.0]])}, "position_ids must be integers, got torch.float32"),
    ({"position_ids": torch.tensor([[0, -1, 0]])}, "position_ids must be >= 0 (each token's position in its document)"),
    ({"cu_seqlens": torch.tensor([0, 2])}, "cu_seqlens must increase strictly from 0 to B * T = 3, got [0, 2]"),
    ({"cu_seqlens": torch.tensor([0, 2, 2, 3])},
     "cu_seqlens must increase strictly from 0 to B * T = 3, got [0, 2, 2, 3]"),
    ({"cu_seqlens": torch.tensor([[0, 3]])}, "cu_seqlens must be a 1-D integer tensor [D + 1], got [1, 2] torch.int64"),
    ({"cu_seqlens": torch.tensor([0, 3]), "position_ids": torch.tensor([[0, 1, 2]])},
     "give the document boundaries once: position_ids or cu_seqlens, not both"),
])
def test_bad_boundaries_are_refused(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        document_starts(1, 3, **kwargs)


def test_cu_seqlens_cannot_run_a_document_across_rows():
    message = ("cu_seqlens must hold every row start b * T: 3 (row 1) is missing, and a document cannot run from one "
               "row into the next; to continue a carried state, pass position_ids")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        document_starts(2, 3, cu_seqlens=torch.tensor([0, 2, 6]))


# ------------------------------------------------------------------------------------- one validation of the inputs

@pytest.mark.parametrize("name", ["position_ids", "cu_seqlens"])
@pytest.mark.parametrize("form,kind", [(list, "list"), (np.array, "numpy.ndarray"), (tuple, "tuple")])
def test_a_non_tensor_is_refused_by_name(name, form, kind):
    values = {"position_ids": [[0, 1, 0, 1]] * 2, "cu_seqlens": [0, 2, 4, 6, 8]}[name]
    message = f"{name} must be a torch integer tensor, got {kind} (torch.as_tensor converts it)"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        document_starts(2, 4, **{name: form(values)})


@pytest.mark.parametrize("name,value", [("position_ids", torch.tensor([[True, False, True, False]] * 2)),
                                        ("cu_seqlens", torch.tensor([False, True])),
                                        ("cu_seqlens", torch.tensor([0.0, 4.0, 8.0]))])
def test_bool_and_float_boundaries_are_refused_as_not_integers(name, value):
    # a bool cu_seqlens passed the old "not floating" test and was then reported as [0, 1]
    with pytest.raises(ValueError, match="^" + re.escape(f"{name} must be integers, got {value.dtype}") + "$"):
        document_starts(2, 4, **{name: value})


def test_one_row_of_position_ids_is_every_rows():
    """[1, T] (Hugging Face's form) is broadcast to the batch, as the Hugging Face model takes it."""
    row = torch.tensor([[0, 1, 2, 0, 1]])
    assert torch.equal(document_starts(3, 5, position_ids=row), document_starts(3, 5, position_ids=row.expand(3, 5)))
    starts = document_starts(3, 5, position_ids=row)
    assert torch.equal(document_positions(starts, row), row.expand(3, 5))
    message = "position_ids must be [B, T] = [3, 5] or [1, T] = [1, 5] (every row's), got [2, 5]"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        document_starts(3, 5, position_ids=row.expand(2, 5))
    with pytest.raises(ValueError, match=re.escape("position_ids must be a torch integer tensor, got list")):
        document_positions(starts, [[0, 1, 2, 0, 1]])
    with pytest.raises(ValueError, match=re.escape("doc_start must be a [B, T] bool tensor, got list")):
        check_doc_start([[True, False]])


def test_the_native_model_takes_one_row_of_position_ids_as_the_hf_model_does():
    """TransformerVQ reads [1, T] position_ids as every row's: the same logits as the [B, T] expansion (abs_pos on,
    so the positions the embedding reads are broadcast too)."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", block_len=4, abs_pos=True)).double().eval()
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    row = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    with torch.no_grad():
        one, every = model(ids, position_ids=row), model(ids, position_ids=row.expand(2, 8).clone())
    assert torch.equal(one.logits, every.logits)


# ------------------------------------------------------------------------- DataCollatorWithFlattening's other keys

def test_seq_idx_starts_a_document_where_it_changes_and_at_every_row():
    seq_idx = torch.tensor([[0, 0, 1, 1, 1, 4], [4, 4, 4, 5, 5, 5]], dtype=torch.int32)
    assert starts_from_seq_idx(seq_idx, 2, 6).tolist() == [[1, 0, 1, 0, 0, 1], [1, 0, 0, 1, 0, 0]]


def test_every_description_of_the_flattened_row_gives_the_same_positions():
    position_ids = torch.tensor([[0, 1, 2, 0, 0, 1]])
    forms = [{"cu_seq_lens_q": torch.tensor([0, 3, 4, 6], dtype=torch.int32)},
             {"cu_seq_lens_k": torch.tensor([0, 3, 4, 6], dtype=torch.int32), "max_length_k": 3},
             {"seq_idx": torch.tensor([[0, 0, 0, 1, 2, 2]], dtype=torch.int32)},
             {"cu_seq_lens_q": torch.tensor([0, 3, 4, 6]), "cu_seq_lens_k": torch.tensor([0, 3, 4, 6]),
              "max_length_q": 3, "max_length_k": torch.tensor(5), "seq_idx": torch.tensor([[0, 0, 0, 1, 2, 2]])}]
    for kwargs in forms:
        assert torch.equal(flattened_positions(None, kwargs, 1, 6), position_ids)
        assert torch.equal(flattened_positions(position_ids, kwargs, 1, 6), position_ids)
    assert flattened_positions(None, {"colour": 1}, 1, 6) is None


REMEDY = "; pass position_ids (DataCollatorWithFlattening's default)"
CU = torch.tensor([0, 3, 4, 6])


@pytest.mark.parametrize("position_ids,kwargs,extra,message", [
    (None, {"cu_seq_lens_q": CU, "cu_seq_lens_k": torch.tensor([0, 2, 6])}, {},
     "cu_seq_lens_q and cu_seq_lens_k describe different documents: at row 0, column 2, cu_seq_lens_q says "
     "position 2, cu_seq_lens_k 0"),
    (torch.tensor([[0, 1, 2, 3, 0, 1]]), {"cu_seq_lens_q": CU}, {},
     "position_ids and cu_seq_lens_q describe different documents: at row 0, column 3, position_ids says position 3, "
     "cu_seq_lens_q 0"),
    (None, {"cu_seq_lens_q": CU, "seq_idx": torch.tensor([[0, 0, 0, 1, 1, 1]])}, {},
     "cu_seq_lens_q and seq_idx describe different documents: at row 0, column 4, cu_seq_lens_q says position 0, "
     "seq_idx 1"),
    (None, {"cu_seq_lens_q": CU, "max_length_q": 2}, {},
     "max_length_q must be an integer no smaller than the longest document (3 tokens), got 2"),
    (None, {"cu_seq_lens_q": CU, "max_length_q": 3.0}, {},
     "max_length_q must be an integer no smaller than the longest document (3 tokens), got 3.0"),
    (None, {"max_length_q": 3, "max_length_k": 3}, {}, "max_length_k, max_length_q cannot say alone where the "
                                                       "documents start"),
    (None, {"cu_seq_lens_q": torch.tensor([0, 3, 7])}, {},
     "cu_seq_lens_q must increase strictly from 0 to B * T = 6, got [0, 3, 7]"),
    (None, {"cu_seq_lens_q": [0, 3, 6]}, {},
     "cu_seq_lens_q must be a torch integer tensor, got list (torch.as_tensor converts it)"),
    (None, {"seq_idx": torch.tensor([[0.0, 0, 0, 1, 1, 1]])}, {}, "seq_idx must be integers, got torch.float32"),
    (None, {"cu_seq_lens_q": CU}, {"mask": torch.tensor([[1, 1, 1, 1, 1, 0]])},
     "cu_seq_lens_q can only describe whole documents of unpadded rows, but the attention mask holds padding"),
    (None, {"seq_idx": torch.zeros(1, 6, dtype=torch.long)}, {"continued": 5},
     "seq_idx can only describe documents that begin in this call, but the cache continued holds 5 earlier "
     "tokens"),
])
def test_unusable_or_disagreeing_descriptions_are_refused_with_the_remedy(position_ids, kwargs, extra, message):
    with pytest.raises(ValueError, match="^" + re.escape(message + REMEDY) + "$"):
        flattened_positions(position_ids, kwargs, 1, 6, **extra)
