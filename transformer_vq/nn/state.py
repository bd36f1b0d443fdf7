"""The state a causal model returns and takes back to continue the same sequences, and the check that a state given
back is one the model can continue (a state of another model, or of a padded call, continued without a word would
give numbers that are no one's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ModelState:
    """Per-unit attention states of a batch of sequences, plus the number of tokens consumed."""

    offset: int
    layers: list[Any]
    padded: bool = False
    """Whether the call that returned it held padding (trailing, in ``mask``): the rows' caches hold those
    positions' keys, so it is not continued (:func:`check_continued_state`)."""
    positions: Any = None
    """``[B]`` int64 or None: where a call gave packed documents' positions, each row's position in its last
    document of the next token, which an absolute position embedding continues from (None: the row's, ``offset``;
    a row's last document is the one a continuation continues)."""

    def detach(self) -> "ModelState":
        """A copy cut from the autograd graph (truncated backprop between training windows)."""
        return ModelState(self.offset, [s.detach() if s is not None else None for s in self.layers], self.padded,
                          self.positions)

    def nbytes(self) -> int:
        """Memory held by the states' tensors, in bytes."""
        return sum(s.nbytes() for s in self.layers if s is not None)


def check_continued_state(state, n_layers: int, model: str) -> None:
    """Raise ``ValueError`` unless ``state`` is a state that ``model`` (its class name) returned and can continue:
    a :class:`ModelState` of ``n_layers`` layer states, not ending in padding."""
    if not isinstance(state, ModelState):
        raise ValueError(f"state must be the ModelState that a previous call of this {model} returned (or None), "
                         f"got {type(state).__name__}")
    if len(state.layers) != n_layers:
        raise ValueError(f"state holds the states of {len(state.layers)} layers and this {model} has {n_layers}: "
                         f"it was returned by another model")
    if state.padded:
        raise ValueError("state was returned by a call whose mask held padding: its rows' caches hold those "
                         "positions' keys, which a continuation would attend; continue only calls without padding "
                         "(rows of different lengths: transformer_vq.models.tvq.ragged)")
