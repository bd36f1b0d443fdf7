"""The state the VQ operator carries between calls: a per-code cache and the keys of the current window."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from transformer_vq.ops.protocol import check_state


@dataclass
class VQAttentionState:
    """What the operator carries between calls on consecutive pieces of the same sequences.

    With ``n = offset // L`` the block of the next query, keys at positions ``< (n - 1) L`` are
    summarized per code in ``cache_count`` / ``cache_mean``; the keys of positions
    ``[max(0, (n - 1) L), offset)`` (at most ``2L - 1`` of them) are kept verbatim in ``recent_*`` (those of them
    since the sequence's first position, for a state made by ``empty(offset=...)``).
    Its size is bounded whatever the offset (docs/operator.md, "State").
    """

    offset: int
    """Number of tokens consumed so far."""
    cache_count: torch.Tensor
    """``[B, G, S]`` float32: number of summarized keys per code."""
    cache_mean: torch.Tensor
    """``[B, G, S, Dv]``: mean of the values of the summarized keys per code (0 where the count is 0)."""
    recent_k: torch.Tensor
    """``[B, G, W, Dk]``: keys of the not-yet-summarized positions."""
    recent_v: torch.Tensor
    """``[B, G, W, Dv]``: their values."""
    recent_z: torch.Tensor
    """``[B, G, W]`` int64: their shortcodes."""
    recent_start: torch.Tensor
    """``[B, W]`` bool: which of them began a document (packed documents, :mod:`transformer_vq.ops.documents`);
    the per-code cache always summarizes only the document of the last key it holds."""
    block_len: int | None = None
    """The block length ``L`` of the calls that made it: which keys are in the window and which are summarized
    depends on it, so a call with another ``L`` is refused. ``None`` for a state that holds no key yet (any ``L``
    may start from it) and for states saved before it was recorded."""
    documents: bool = field(default=False, metadata={"rows": any})
    """Whether ``recent_start`` may hold a document start: the state of a call with ``doc_start`` (or of one that
    continued such a state). A call without ``doc_start`` then still hides the earlier documents of its window. Kept
    on the host so that deciding reads nothing off the device (a sync per decoded token and layer on a GPU).
    ``metadata["rows"]``: how the rows of separate states combine into one batch (any of them)."""

    @classmethod
    def empty(cls, batch: int, groups: int, n_code: int, d_k: int, d_v: int, *, dtype: torch.dtype,
              device: torch.device | str | None = None, offset: int = 0) -> "VQAttentionState":
        """The state of a sequence with no tokens yet, whose first token will sit at position ``offset`` of the block
        grid (a packed document run by itself where it sits in its row)."""
        acc_dtype = torch.promote_types(dtype, torch.float32)
        return cls(
            offset=offset,
            cache_count=torch.zeros(batch, groups, n_code, dtype=torch.float32, device=device),
            cache_mean=torch.zeros(batch, groups, n_code, d_v, dtype=acc_dtype, device=device),
            recent_k=torch.zeros(batch, groups, 0, d_k, dtype=dtype, device=device),
            recent_v=torch.zeros(batch, groups, 0, d_v, dtype=dtype, device=device),
            recent_z=torch.zeros(batch, groups, 0, dtype=torch.long, device=device),
            recent_start=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        )

    def detach(self) -> "VQAttentionState":
        """A copy cut from the autograd graph (truncated backprop between training windows)."""
        return replace(self, **{name: tensor.detach() for name, tensor in self._tensors().items()})

    def nbytes(self) -> int:
        """Memory held by the state's tensors, in bytes."""
        return sum(tensor.numel() * tensor.element_size() for tensor in self._tensors().values())

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}


_STATE_DTYPES = {wide: {"cache_count": torch.float32, "cache_mean": torch.float64 if wide else torch.float32,
                       "recent_k": None, "recent_v": None, "recent_z": torch.long, "recent_start": torch.bool}
                 for wide in (False, True)}
"""The dtype of each tensor of a :class:`VQAttentionState` for queries of float64 or not (``None``: one of the call's,
:func:`~transformer_vq.ops.protocol.call_dtypes`), as :meth:`VQAttentionState.empty` makes them: float32 counts,
means of ``promote_types(dtype, float32)`` (looked up: a promotion costs about a microsecond at every call)."""


def check_vq_state(state, q: torch.Tensor, v: torch.Tensor, codebook: torch.Tensor, block_len: int) -> None:
    """Raise ``ValueError`` unless ``state`` can continue a call on ``q``, ``v`` and ``codebook``: a
    :class:`VQAttentionState` of the same block length, batch, groups, codebook size, key and value widths, dtypes and
    device, its window at most ``2L - 1`` keys."""
    (batch, _, _, d_k), d_v, (groups, n_code) = q.shape, v.shape[-1], codebook.shape[:2]
    window = state.recent_k.shape[2] if isinstance(state, VQAttentionState) and state.recent_k.dim() == 4 else -1
    check_state(state, VQAttentionState, {
        "cache_count": (batch, groups, n_code), "cache_mean": (batch, groups, n_code, d_v),
        "recent_k": (batch, groups, window, d_k), "recent_v": (batch, groups, window, d_v),
        "recent_z": (batch, groups, window), "recent_start": (batch, window),
    }, q, _STATE_DTYPES[q.dtype == torch.float64])
    if state.block_len is not None and state.block_len != block_len:
        raise ValueError(f"state was built with block_len={state.block_len}, got block_len={block_len}: which keys "
                         f"a state holds in its window and which it summarizes depends on the block length")
    if window >= 2 * block_len:
        raise ValueError(f"state holds {window} window keys, at most 2 * block_len - 1 = {2 * block_len - 1} "
                         f"for block_len={block_len}")
