"""Document boundaries from either convention (cu_seqlens, position_ids) become one ``doc_start`` mask."""

from __future__ import annotations

import re

import pytest
import torch

from transformer_vq.ops.documents import document_starts, segment_ids


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
