"""The decoding state of the quadratic baselines: every key and value consumed so far."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.protocol import check_state


@dataclass
class KVCache:
    """Every key and value consumed so far (grows with the context: the cost VQ attention avoids)."""

    k: torch.Tensor
    """``[B, G, P, Dk]`` keys of positions ``0 .. P-1``."""
    v: torch.Tensor
    """``[B, G, P, Dv]`` values of the same positions."""
    segment: torch.Tensor | None = None
    """``[B, P]`` int64 packed-document segment of each position (``None``: one document per row)."""

    @classmethod
    def start(cls, k: torch.Tensor, v: torch.Tensor, doc_start: torch.Tensor | None = None) -> "KVCache":
        """The cache of the first call on ``k``, ``v``, with the segments of ``doc_start [B, T]``.

        Copies: a cache holding the caller's tensors would change with them, and a decoding loop that refills one
        input buffer per step would rewrite the keys of its state. The copy is differentiable (gradients reach
        ``k`` and ``v`` as before), and contiguous, which the concatenation of the next call reads fastest."""
        return cls(k.clone(memory_format=torch.contiguous_format), v.clone(memory_format=torch.contiguous_format),
                   None if doc_start is None else segment_ids(doc_start))

    @property
    def offset(self) -> int:
        """Number of positions consumed (the absolute position of the next token)."""
        return self.k.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor, doc_start: torch.Tensor | None = None) -> "KVCache":
        """A new cache with ``k [B, G, T, Dk]`` and ``v [B, G, T, Dv]`` appended (copies: never mutates ``self``);
        ``doc_start [B, T]``: where packed documents begin among them."""
        segment = self.segment
        if doc_start is not None or segment is not None:
            last = self.k.new_zeros(k.shape[0], 1, dtype=torch.long) if segment is None else segment[:, -1:]
            new = last + (torch.zeros(k.shape[0], k.shape[2], dtype=torch.long, device=k.device)
                          if doc_start is None else segment_ids(doc_start))
            segment = new if segment is None else torch.cat([segment, new], dim=1)
        return KVCache(torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2), segment)

    def detach(self) -> "KVCache":
        """The same cache cut from the autograd graph (truncated backprop between training windows)."""
        return KVCache(self.k.detach(), self.v.detach(), self.segment)

    def nbytes(self) -> int:
        """Bytes held by the cache (grows linearly with the number of positions)."""
        held = [self.k, self.v] + ([] if self.segment is None else [self.segment])
        return sum(t.nelement() * t.element_size() for t in held)


def continue_cache(state: KVCache | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   doc_start: torch.Tensor | None = None) -> KVCache:
    """The cache after a call on ``q``, ``k [B, G, T, Dk]``, ``v [B, G, T, Dv]``: :meth:`KVCache.start` without a
    state, else ``state`` extended, once :func:`check_kv_cache` has checked it."""
    if state is None:
        return KVCache.start(k, v, doc_start)
    check_kv_cache(state, q, k, v)
    return state.extend(k, v, doc_start)


def check_kv_cache(state, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``state`` is a :class:`KVCache` of the same batch, groups and widths as ``k``,
    ``v``, on ``q``'s device and in a dtype of the call (a float32 cache continued in float64 would be promoted)."""
    (batch, groups, _, d_k), d_v = k.shape, v.shape[-1]
    # the cache's own length where it has one: exact shapes are compared by one comparison each
    held = state.k.shape[2] if isinstance(state, KVCache) and state.k.dim() == 4 else -1
    check_state(state, KVCache, {"k": (batch, groups, held, d_k), "v": (batch, groups, held, d_v),
                                 "segment": (batch, held)}, q, _DTYPES)


_DTYPES = {"k": None, "v": None, "segment": torch.long}
"""The dtype of each tensor of a :class:`KVCache` (``None``: one of the call's,
:func:`~transformer_vq.ops.protocol.call_dtypes`)."""
