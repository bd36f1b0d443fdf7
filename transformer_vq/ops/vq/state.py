"""The state the VQ operator carries between calls: a per-code cache and the keys of the current window."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


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
        return VQAttentionState(
            self.offset, *(getattr(self, f.name).detach() for f in fields(self) if f.name != "offset")
        )

    def nbytes(self) -> int:
        """Memory held by the state's tensors, in bytes."""
        return sum(
            getattr(self, f.name).numel() * getattr(self, f.name).element_size()
            for f in fields(self) if f.name != "offset"
        )
