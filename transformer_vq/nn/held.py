"""A value derived from some tensors, held between calls while those tensors hold the same values.

Decoding calls a unit once per token, and some of what it computes depends on its weights alone (the relative-position
table ``R = W_r sinusoids``; quantized queries' code-pair table): rebuilding it per token costs more than the token's
attention, so it is held. The key is what it was built from, compared by value: a copy of each source tensor.

Why not a cheaper key (a tensor's ``_version`` and ``data_ptr()``): both can stay the same while the values change.
FSDP2 all-gathers a new unsharded parameter into memory that the allocator often hands back at the same address,
and keeps its version counter unchanged on purpose; ``p.data.copy_(...)`` and ``p.data = ...`` do not count as
in-place changes either. Keyed that way, an FSDP validation after an optimizer step read the table of the previous
step's weights whenever the address was reused — a timing-dependent ~1e-4 error in the loss (docs/distributed.md).
A comparison costs one read of the sources, a small fraction of the derivation it saves (``W_r`` is ``Dm x H Dk``;
its table is ``P`` times that in multiply-adds), and on a GPU one synchronization, which decoding does per token
anyway.

The ``key`` a caller gives is completed with the autocast state of the sources' devices: a build runs under the
caller's autocast (its matmuls then return bfloat16 or float16), so a value built inside ``torch.autocast`` is not the
one a float32 call would build from the same tensors. Keyed by the caller's dtype alone (the float32 codebook's), a
float32 decoding after a bfloat16 one read the bfloat16 code-pair table: logits 4e-3 off, greedy tokens changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch


class HeldValue:
    """Holds ``build()``'s result until a source tensor's values, or the ``key`` it was built with, change."""

    def __init__(self) -> None:
        self._sources: tuple[torch.Tensor, ...] | None = None
        self._key: Hashable = None
        self._value = None

    def get(self, sources: Sequence[torch.Tensor], key: Hashable, build: Callable[[], object]):
        """The held value if it was built from tensors equal to ``sources`` (same shape, dtype, device and values)
        and with an equal ``key``; otherwise ``build()``'s result, held from now on. Under ``torch.compile`` nothing
        is held: the graph computes the value each call."""
        if torch.compiler.is_compiling():
            return build()
        key = (key, _autocast_state(sources))
        if self._sources is None or self._key != key or not _same(self._sources, sources):
            value = build()
            self._sources, self._key, self._value = tuple(s.detach().clone() for s in sources), key, value
        return self._value

    def clear(self) -> None:
        """Drop the held value and the copies of its sources."""
        self._sources, self._key, self._value = None, None, None


def _autocast_state(sources: Sequence[torch.Tensor]) -> tuple:
    """Whether autocast is on, and to which dtype, for each device type of ``sources``: what a build's dtypes follow."""
    kinds = sorted({s.device.type for s in sources})
    return tuple((kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in kinds)


def _same(held: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> bool:
    return len(held) == len(sources) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
        for a, b in zip(held, sources))
