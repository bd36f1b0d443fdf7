"""The decoding state of a Transformer-VQ model as a ``transformers`` cache.

``generate`` carries a :class:`~transformers.Cache` between forward calls; here it holds, per gated attention unit,
the attention operator's own state: for VQ attention the per-code cache counts and means of the summarized keys plus
the keys of the current window (``transformer_vq.ops.vq.state.VQAttentionState``), whose size is bounded whatever the
context length (docs/operator.md, "State"). The library's model reads and returns these states
(``transformer_vq.nn.model.ModelState``); this class only stores them between calls and supports what ``generate``
does to a cache besides (reordering rows for beam search, repeating them for several samples per prompt).
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from transformer_vq.nn.model import ModelState


def map_state_tensors(state, fn):
    """A copy of an operator state (a dataclass) with ``fn`` applied to each of its tensors (all batch-first)."""
    return dataclasses.replace(state, **{
        f.name: fn(getattr(state, f.name)) for f in dataclasses.fields(state)
        if isinstance(getattr(state, f.name), torch.Tensor)
    })


class UnitStateLayer(CacheLayerMixin):
    """The cache of one gated attention unit: its operator's state (``None`` before the first token)."""

    def __init__(self):
        super().__init__()
        self.state = None

    @property
    def is_initialized(self) -> bool:
        return self.state is not None

    @is_initialized.setter
    def is_initialized(self, value: bool) -> None:
        pass  # derived from ``state``; the base class assigns it in __init__

    @property
    def batch_size(self) -> int:
        return state_batch_size(self.state)

    def lazy_initialization(self, key_states, value_states) -> None:
        raise NotImplementedError("a Transformer-VQ unit's state is built by its attention operator, not from "
                                  "key and value tensors")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a Transformer-VQ unit's state is replaced whole by the model (TransformerVQCache."
                                  "set_model_state), not appended to")

    def get_seq_length(self) -> int:
        return 0 if self.state is None else self.state.offset

    def get_max_length(self) -> int:
        return -1  # no limit: the state's size does not grow with the context

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def reset(self) -> None:
        self.state = None

    def crop(self, tokens_to_remove: int) -> None:
        """Only ``crop(0)`` (a no-op): keys older than the current window are summarized and cannot be taken out."""
        if tokens_to_remove != 0:
            raise ValueError("a Transformer-VQ cache cannot drop tokens: keys before the current window are "
                             "summarized per code")

    def offload(self) -> None:
        pass  # generate offloads only caches made with offloading=True, which this model never makes

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def _map(self, fn) -> None:
        if self.state is not None:
            self.state = map_state_tensors(self.state, fn)


def state_batch_size(state) -> int:
    """The batch size of an operator state (0 before the first token)."""
    if state is None:
        return 0
    return next(getattr(state, f.name).shape[0] for f in dataclasses.fields(state)
                if isinstance(getattr(state, f.name), torch.Tensor))


class TransformerVQCache(Cache):
    """One :class:`UnitStateLayer` per gated attention unit (``2 * n_layers`` of them).

    Its size is bounded whatever the number of tokens consumed (for VQ attention and FLASH; the ``full`` baseline's
    state is a growing key/value cache): :meth:`nbytes` measures it.
    """

    def __init__(self, n_units: int):
        super().__init__(layers=[UnitStateLayer() for _ in range(n_units)])

    def model_state(self) -> ModelState | None:
        """The library model's state for the next forward call (``None`` before the first token)."""
        if not self.layers[0].is_initialized:
            return None
        return ModelState(self.get_seq_length(), [layer.state for layer in self.layers])

    def set_model_state(self, state: ModelState) -> None:
        """Store the state a forward call of the library model returned."""
        if len(state.layers) != len(self.layers):
            raise ValueError(f"the model state has {len(state.layers)} units, this cache {len(self.layers)}")
        for layer, unit_state in zip(self.layers, state.layers):
            layer.state = unit_state

    def nbytes(self) -> int:
        """Bytes held by the carried states."""
        model_state = self.model_state()
        return 0 if model_state is None else model_state.nbytes()


# Registering with the auto classes happens in modeling (which needs this module): importing this module alone
# registers too (transformer_vq.hf.hook explains the order).
import transformer_vq.hf.modeling  # noqa: E402,F401
