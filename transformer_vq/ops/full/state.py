"""The decoding state of the quadratic baselines: every key and value consumed so far."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Every key and value consumed so far (grows with the context: the cost VQ attention avoids)."""

    k: torch.Tensor
    """``[B, G, P, Dk]`` keys of positions ``0 .. P-1``."""
    v: torch.Tensor
    """``[B, G, P, Dv]`` values of the same positions."""

    @property
    def offset(self) -> int:
        """Number of positions consumed (the absolute position of the next token)."""
        return self.k.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> "KVCache":
        """A new cache with ``k [B, G, T, Dk]`` and ``v [B, G, T, Dv]`` appended (copies: never mutates ``self``)."""
        return KVCache(torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2))

    def detach(self) -> "KVCache":
        """The same cache cut from the autograd graph (truncated backprop between training windows)."""
        return KVCache(self.k.detach(), self.v.detach())

    def nbytes(self) -> int:
        """Bytes held by the cache (grows linearly with the number of positions)."""
        return self.k.nelement() * self.k.element_size() + self.v.nelement() * self.v.element_size()
