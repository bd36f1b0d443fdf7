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

Both are torch integer tensors (a list, a NumPy array or a bool tensor is refused by name:
:func:`check_integer_tensor`), and ``position_ids`` may be ``[1, T]``, every row's. Hugging Face's collator may
describe its flattened row in other ways besides (or instead of) ``position_ids``: :func:`flattened_positions` reads
them into the ``position_ids`` they imply, checked to agree.

Within a call, the segment of a token is the number of document starts up to it (:func:`segment_ids`); a query and a
key belong to the same document exactly when their segments are equal.
"""

from __future__ import annotations

import torch

from transformer_vq.config.fields import is_integer


def document_starts(batch: int, length: int, *, position_ids: torch.Tensor | None = None,
                    cu_seqlens: torch.Tensor | None = None, device=None) -> torch.Tensor | None:
    """``doc_start [B, T]`` bool from ``position_ids`` or ``cu_seqlens`` (``None`` when neither is given).

    ``position_ids`` may be ``[1, T]`` for every row alike (Hugging Face's form, :func:`document_rows`). Raises
    ``ValueError`` naming the argument when it is not a torch integer tensor (a list, a NumPy array, a bool tensor)
    or does not describe documents of a ``[batch, length]`` call.
    """
    if position_ids is not None and cu_seqlens is not None:
        raise ValueError("give the document boundaries once: position_ids or cu_seqlens, not both")
    if position_ids is not None:
        return _starts_from_positions(position_ids, batch, length)
    if cu_seqlens is not None:
        return starts_from_cu_seqlens(cu_seqlens, batch, length, device=device)
    return None


def check_integer_tensor(value, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a torch tensor of integers (not bool: a bool tensor
    would read as the integers 0 and 1, not as what the caller meant)."""
    if not isinstance(value, torch.Tensor):
        kind = type(value).__qualname__ if type(value).__module__ == "builtins" else \
            f"{type(value).__module__}.{type(value).__qualname__}"
        raise ValueError(f"{name} must be a torch integer tensor, got {kind} (torch.as_tensor converts it)")
    if value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex:
        raise ValueError(f"{name} must be integers, got {value.dtype}")


def document_rows(value, name: str, batch: int, length: int) -> torch.Tensor:
    """``value``, one integer per token (``position_ids``), as ``[batch, length]``: a ``[1, length]`` tensor is
    every row's (Hugging Face's form; broadcast, not copied). Raises ``ValueError`` naming ``name`` otherwise."""
    check_integer_tensor(value, name)
    if value.dim() == 2 and value.shape[0] == 1 and value.shape[1] == length:
        value = value.expand(batch, length)
    if value.shape != (batch, length):
        shared = f" or [1, T] = [1, {length}] (every row's)" if batch != 1 else ""
        raise ValueError(f"{name} must be [B, T] = [{batch}, {length}]{shared}, got {list(value.shape)}")
    return value


def _starts_from_positions(position_ids: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    position_ids = document_rows(position_ids, "position_ids", batch, length)
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


def starts_from_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, length: int, *, device=None,
                           name: str = "cu_seqlens") -> torch.Tensor:
    """``doc_start [B, T]`` of flash-attention's cumulative lengths over the flattened ``B * T`` tokens (named
    ``name`` in the errors)."""
    total = batch * length
    check_integer_tensor(cu_seqlens, name)
    if cu_seqlens.dim() != 1 or len(cu_seqlens) < 2:
        raise ValueError(f"{name} must be a 1-D integer tensor [D + 1], got {list(cu_seqlens.shape)} "
                         f"{cu_seqlens.dtype}")
    bounds = cu_seqlens.to(torch.long).cpu()
    if int(bounds[0]) != 0 or int(bounds[-1]) != total or bool((bounds[1:] <= bounds[:-1]).any()):
        raise ValueError(f"{name} must increase strictly from 0 to B * T = {total}, got {bounds.tolist()}")
    starts = torch.zeros(total, dtype=torch.bool)
    starts[bounds[:-1]] = True
    starts = starts.view(batch, length)
    if not bool(starts[:, 0].all()):
        row = int((~starts[:, 0]).nonzero()[0])
        raise ValueError(f"{name} must hold every row start b * T: {row * length} (row {row}) is missing, and a "
                         "document cannot run from one row into the next; to continue a carried state, pass "
                         "position_ids")
    return starts.to(device if device is not None else cu_seqlens.device)


def starts_from_seq_idx(seq_idx: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """``doc_start [B, T]`` of ``seq_idx`` ``[B, T]`` (or ``[1, T]``), each token's document number: a document
    starts at every row's first token and wherever the number changes."""
    seq_idx = document_rows(seq_idx, "seq_idx", batch, length)
    starts = torch.ones(batch, length, dtype=torch.bool, device=seq_idx.device)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    return starts


def document_positions(doc_start: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` int64: each token's position in its document, what a model's absolute position embedding reads
    of a packed row (the row's own positions would give a document the positions of where it was packed):
    ``position_ids`` as given (``[1, T]``: every row's, as :func:`document_starts` reads them), else
    (``cu_seqlens``, whose rows all start a document) counted from each start."""
    check_doc_start(doc_start)
    if position_ids is not None:
        return document_rows(position_ids, "position_ids", *doc_start.shape).to(torch.long)
    columns = torch.arange(doc_start.shape[-1], device=doc_start.device).expand_as(doc_start)
    start = torch.where(doc_start, columns, torch.zeros_like(columns)).cummax(dim=-1).values
    return columns - start


def segment_ids(doc_start: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` int64: the number of document starts at or before each token (equal within one document)."""
    return doc_start.to(torch.long).cumsum(dim=-1)


def check_doc_start(doc_start: torch.Tensor | None, batch: int | None = None, length: int | None = None) -> None:
    """Raise ``ValueError`` unless ``doc_start`` is ``None`` or a ``[B, T]`` bool tensor (of ``[batch, length]``
    when they are given)."""
    if doc_start is None:
        return
    want = "[B, T]" if batch is None else f"[B, T] = [{batch}, {length}]"
    if not isinstance(doc_start, torch.Tensor):
        raise ValueError(f"doc_start must be a {want} bool tensor, got {type(doc_start).__qualname__}")
    shape_ok = doc_start.dim() == 2 if batch is None else doc_start.shape == (batch, length)
    if not shape_ok or doc_start.dtype != torch.bool:
        raise ValueError(f"doc_start must be a {want} bool tensor, got {list(doc_start.shape)} {doc_start.dtype}")


FLATTENING_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""What Hugging Face's ``DataCollatorWithFlattening`` passes besides ``position_ids`` (or instead, with
``return_position_ids=False``) to describe the documents of its flattened row: flash-attention's varlen arguments
(``return_flash_attn_kwargs=True``) and each token's document number (``return_seq_idx=True``)."""
USE_POSITION_IDS = "pass position_ids (DataCollatorWithFlattening's default)"


def flattened_positions(position_ids: torch.Tensor | None, kwargs: dict, batch: int, length: int, *,
                        mask: torch.Tensor | None = None, continued: int = 0, device=None) -> torch.Tensor | None:
    """``position_ids`` as ``[batch, length]`` (:func:`document_rows`), or the positions that the
    :data:`FLATTENING_KEYS` among ``kwargs`` imply (other keys are not read), so that every description of packed
    documents runs as ``position_ids`` do: ``cu_seq_lens_q``/``_k`` read as ``cu_seqlens``, ``seq_idx`` as a document
    starting wherever it changes, each document counted from 0 (``None`` when nothing describes positions).

    Every description given must say the same (``position_ids`` too); ``max_length_q``/``_k`` must be integers no
    smaller than the longest document. These keys describe whole documents of unpadded rows: an attention ``mask``
    with padding, or a call that continues ``continued > 0`` tokens of a cache, is refused. Raises ``ValueError``
    saying what is unusable or which disagree, and to :data:`USE_POSITION_IDS`.
    """
    given = {name: kwargs[name] for name in FLATTENING_KEYS if kwargs.get(name) is not None}
    if not given:
        return None if position_ids is None else document_rows(position_ids, "position_ids", batch, length)
    try:
        return _agreed_positions(position_ids, given, batch, length, mask, continued, device)
    except ValueError as error:
        raise ValueError(f"{error}; {USE_POSITION_IDS}") from None


def _agreed_positions(position_ids, given: dict, batch: int, length: int, mask, continued: int,
                      device) -> torch.Tensor:
    names = ", ".join(sorted(given))
    if continued:
        raise ValueError(f"{names} can only describe documents that begin in this call, but the cache continued "
                         f"holds {continued} earlier tokens")
    if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
        raise ValueError(f"{names} can only describe whole documents of unpadded rows, but the attention mask "
                         f"holds padding")
    implied = {}
    if position_ids is not None:
        implied["position_ids"] = document_rows(position_ids, "position_ids", batch, length).to(torch.long)
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if name in given:
            starts = starts_from_cu_seqlens(given[name], batch, length, device=device, name=name)
            implied[name] = document_positions(starts)
    if "seq_idx" in given:
        implied["seq_idx"] = document_positions(starts_from_seq_idx(given["seq_idx"], batch, length))
    if not implied:
        raise ValueError(f"{names} cannot say alone where the documents start")
    (first, positions), *others = implied.items()
    for name, other in others:
        other = other.to(positions.device)
        if not torch.equal(other, positions):
            row, column = (int(i) for i in (other != positions).nonzero()[0])
            raise ValueError(f"{first} and {name} describe different documents: at row {row}, column {column}, "
                             f"{first} says position {int(positions[row, column])}, {name} "
                             f"{int(other[row, column])}")
    longest = int(positions.max()) + 1
    for name in ("max_length_q", "max_length_k"):
        value = given.get(name)
        if name in given and (not is_integer(value) or int(value) < longest):
            raise ValueError(f"{name} must be an integer no smaller than the longest document ({longest} tokens), "
                             f"got {value!r}")
    return positions
