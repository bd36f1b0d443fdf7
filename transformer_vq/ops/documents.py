"""Packed documents: where each document starts, from either convention, in one place.

A row of a batch may hold several documents one after another (packing: no padding is wasted). Every operator takes
their boundaries as ``doc_start [B, T]`` (bool, True at the first token of a document) and attends each document as
a sequence of its own: a query never sees a key of an earlier document, neither in its window nor through the
compressive cache. Two conventions describe boundaries; :func:`document_starts` turns either into ``doc_start``:

* ``cu_seqlens`` (flash-attention's varlen convention): int ``[D + 1]``, the cumulative lengths of the ``D``
  documents of the flattened ``B * T`` tokens, ``0`` first and ``B * T`` last. Every row starts a document (a
  document cannot run from one row into the next), so a carried state is never continued by this form;
* ``position_ids`` (Hugging Face's ``DataCollatorWithFlattening``): ``[B, T]``, each token's position in its document,
  restarting at 0 where a document starts. A row whose first position is not 0 continues the document of the state
  it is given (truncated backprop through time across windows).

Within a call, the segment of a token is the number of document starts up to it (:func:`segment_ids`); a query and a
key belong to the same document exactly when their segments are equal.
"""

from __future__ import annotations

import torch


def document_starts(batch: int, length: int, *, position_ids: torch.Tensor | None = None,
                    cu_seqlens: torch.Tensor | None = None, device=None) -> torch.Tensor | None:
    """``doc_start [B, T]`` bool from ``position_ids`` or ``cu_seqlens`` (``None`` when neither is given).

    Raises ``ValueError`` naming the argument when it does not describe documents of a ``[batch, length]`` call.
    """
    if position_ids is not None and cu_seqlens is not None:
        raise ValueError("give the document boundaries once: position_ids or cu_seqlens, not both")
    if position_ids is not None:
        return _starts_from_positions(position_ids, batch, length)
    if cu_seqlens is not None:
        return _starts_from_cu_seqlens(cu_seqlens, batch, length, device)
    return None


def _starts_from_positions(position_ids: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    if position_ids.shape != (batch, length):
        raise ValueError(f"position_ids must be [B, T] = [{batch}, {length}], got {list(position_ids.shape)}")
    if position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids must be integers, got {position_ids.dtype}")
    if bool((position_ids < 0).any()):
        raise ValueError("position_ids must be >= 0 (each token's position in its document)")
    # Within a document positions count up by one; anything else but a restart at 0 is not a packed layout.
    step = position_ids[:, 1:] - position_ids[:, :-1]
    broken = (step != 1) & (position_ids[:, 1:] != 0)
    if bool(broken.any()):
        row, col = (int(i) for i in broken.nonzero()[0])
        raise ValueError(f"position_ids of row {row} go from {int(position_ids[row, col])} to "
                         f"{int(position_ids[row, col + 1])} at column {col + 1}: within a document they count up by "
                         "one, and a new document restarts at 0")
    return position_ids == 0


def _starts_from_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, length: int, device) -> torch.Tensor:
    total = batch * length
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or len(cu_seqlens) < 2:
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [D + 1], got {list(cu_seqlens.shape)} "
                         f"{cu_seqlens.dtype}")
    bounds = cu_seqlens.to(torch.long).cpu()
    if int(bounds[0]) != 0 or int(bounds[-1]) != total or bool((bounds[1:] <= bounds[:-1]).any()):
        raise ValueError(f"cu_seqlens must increase strictly from 0 to B * T = {total}, got {bounds.tolist()}")
    starts = torch.zeros(total, dtype=torch.bool)
    starts[bounds[:-1]] = True
    starts = starts.view(batch, length)
    if not bool(starts[:, 0].all()):
        row = int((~starts[:, 0]).nonzero()[0])
        raise ValueError(f"cu_seqlens must hold every row start b * T: {row * length} (row {row}) is missing, and a "
                         "document cannot run from one row into the next; to continue a carried state, pass "
                         "position_ids")
    return starts.to(device if device is not None else cu_seqlens.device)


def document_positions(doc_start: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` int64: each token's position in its document, what a model's absolute position embedding reads
    of a packed row (the row's own positions would give a document the positions of where it was packed):
    ``position_ids`` as given, else (``cu_seqlens``, whose rows all start a document) counted from each start."""
    if position_ids is not None:
        return position_ids.to(torch.long)
    columns = torch.arange(doc_start.shape[-1], device=doc_start.device).expand_as(doc_start)
    start = torch.where(doc_start, columns, torch.zeros_like(columns)).cummax(dim=-1).values
    return columns - start


def segment_ids(doc_start: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` int64: the number of document starts at or before each token (equal within one document)."""
    return doc_start.to(torch.long).cumsum(dim=-1)


def check_doc_start(doc_start: torch.Tensor | None, batch: int, length: int) -> None:
    """Raise ``ValueError`` unless ``doc_start`` is ``None`` or a ``[B, T]`` bool tensor."""
    if doc_start is not None and (doc_start.shape != (batch, length) or doc_start.dtype != torch.bool):
        raise ValueError(f"doc_start must be a [B, T] = [{batch}, {length}] bool tensor, got "
                         f"{list(doc_start.shape)} {doc_start.dtype}")
