"""The decoding state of FLASH (mixed chunk): the linear-attention sum of the finished chunks and the open chunk."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FlashState:
    """Decoding state of ``flash_attention``: the linear-attention sum of the finished chunks and the open chunk."""

    kv_sum: torch.Tensor
    """``[B, G, Dk, Dv]`` sum of ``k[p] v[p]^T`` over every key of the finished chunks."""
    n_chunks: int
    """Number of finished chunks."""
    chunk_len: int
    """``C``."""
    chunk_k: torch.Tensor
    """``[B, G, r, Dk]`` keys of the open chunk (``r = offset % C`` positions, ``r < C``)."""
    chunk_v: torch.Tensor
    """``[B, G, r, Dv]`` values of the open chunk."""
    kv_count: torch.Tensor | None = None
    """``[B]`` with packed documents: how many keys ``kv_sum`` holds (those of the document of the last finished key);
    ``None``: every key of the finished chunks."""
    chunk_start: torch.Tensor | None = None
    """``[B, r]`` bool with packed documents: which keys of the open chunk began a document."""

    @property
    def offset(self) -> int:
        """Number of positions consumed."""
        return self.n_chunks * self.chunk_len + self.chunk_k.shape[2]

    def detach(self) -> "FlashState":
        """The same state cut from the autograd graph."""
        return FlashState(self.kv_sum.detach(), self.n_chunks, self.chunk_len, self.chunk_k.detach(),
                          self.chunk_v.detach(), self.kv_count, self.chunk_start)

    def nbytes(self) -> int:
        """Bytes held by the state (bounded by the chunk length, whatever the offset)."""
        held = (self.kv_sum, self.chunk_k, self.chunk_v, self.kv_count, self.chunk_start)
        return sum(t.nelement() * t.element_size() for t in held if t is not None)
