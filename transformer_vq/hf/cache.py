"""The decoding state of a Transformer-VQ model as a ``transformers`` cache.

``generate`` carries a :class:`~transformers.Cache` between forward calls. This one holds the library's states per row
(:class:`~transformer_vq.models.tvq.ragged.RowStates`): for VQ attention, per gated attention unit, the per-code counts
and means of the summarized keys plus the keys of the current window, whose size is bounded whatever the context length
(docs/operator.md, "State"). Rows are kept per row rather than as one batch because, with padding, the rows of a batch
sit at different positions of their own sequences (``transformer_vq.models.tvq.ragged`` says why that matters); a batch
without padding is one group, the model's own batched state.

``transformers`` counts positions by columns, padding included (the attention mask is ``[B, past + new]``), while
each row's state counts its real tokens: :meth:`TransformerVQCache.get_seq_length` is the former, :meth:`offsets`
the latter.

The per-layer objects of ``transformers``' cache API (:class:`UnitStateLayer`) hold nothing: they answer from the
cache, because the states of all units move together (reordering rows, repeating them for several samples).
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from transformer_vq.models.tvq.ragged import RowStates
from transformer_vq.nn.state import ModelState

# The fingerprint of the columns each row of a cache consumed: a polynomial hash modulo a prime below 2**31, so that
# every product fits in int64 on any device. generate compares it with the first columns of the sequence it is given:
# a cache that another continuation advanced in place is refused, never continued from a state of other tokens.
FINGERPRINT_PRIME = 2_147_483_647
FINGERPRINT_BASE = 1_000_003


def fingerprint(ids: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` int64: the fingerprint of the columns ``previous`` stands for (None: none) followed by ``ids``
    ``[B, T]``."""
    length = ids.shape[1]
    if length == 1:  # a decoding step: no table of powers to copy to the device
        folded = ids[:, 0].long() + 1
    else:
        powers = torch.tensor([pow(FINGERPRINT_BASE, length - 1 - j, FINGERPRINT_PRIME) for j in range(length)])
        folded = ((ids.long() + 1) * powers.to(ids.device) % FINGERPRINT_PRIME).sum(dim=1)  # < T 2**31: no overflow
    if previous is not None:
        folded = folded + previous * pow(FINGERPRINT_BASE, length, FINGERPRINT_PRIME)
    return folded % FINGERPRINT_PRIME


BRANCHES = ("A cache is advanced in place by every call that continues it: to continue one output twice, give each "
            "branch its own copy (copy.deepcopy(out.cache))")

# transformers 5.0 crops to a length (``crop(max_length)``, negative: remove that many); later ones remove a count.
CROP_TAKES_LENGTH = "max_length" in inspect.signature(Cache.crop).parameters


class UnitStateLayer(CacheLayerMixin):
    """The ``transformers`` layer object of one gated attention unit: answers from its :class:`TransformerVQCache`."""

    is_compileable = False
    is_croppable = False

    def __init__(self, cache: "TransformerVQCache"):
        super().__init__()
        self.cache = cache

    @property
    def is_initialized(self) -> bool:
        return self.cache.is_initialized

    @is_initialized.setter
    def is_initialized(self, value: bool) -> None:
        pass  # derived from the cache; the base class assigns it in __init__

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    max_batch_size = batch_size

    def lazy_initialization(self, key_states, value_states) -> None:
        raise NotImplementedError("a Transformer-VQ unit's state is built by its attention operator, not from "
                                  "key and value tensors")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a Transformer-VQ unit's state is replaced whole by the model, not appended to")

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def get_max_length(self) -> int:
        return -1  # no limit: the state's size does not grow with the context

    get_max_cache_shape = get_max_length

    def get_mask_sizes(self, query, *args) -> tuple[int, int]:
        length = query if isinstance(query, int) else query.shape[0]
        return self.get_seq_length() + length, 0

    def reset(self) -> None:
        self.cache.reset()

    def crop(self, value: int) -> None:
        self.cache.crop(value)

    def offload(self) -> None:
        pass  # generate offloads only caches made with offloading=True, which this model never makes

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("reorder the whole TransformerVQCache (its units move together)")

    batch_repeat_interleave = batch_select_indices = reorder_cache


class TransformerVQCache(Cache):
    """The states of a batch's rows between forward calls, and the number of columns consumed.

    Its size is bounded whatever the number of tokens consumed (for VQ attention and FLASH; the ``full`` baseline's
    state is a growing key/value cache): :meth:`nbytes` measures it.
    """

    def __init__(self, n_units: int):
        super().__init__(layers=[UnitStateLayer(self) for _ in range(n_units)])
        self.n_units = n_units
        self.rows: RowStates | None = None
        """Each row's state (``None`` before the first forward call)."""
        self.columns = 0
        """Columns consumed, padding included: the past length of ``transformers``' attention mask."""
        self.consumed: torch.Tensor | None = None
        """``[B]``: the :func:`fingerprint` of each row's consumed columns (None: unknown, a state set from the
        library's, or none consumed)."""

    # ------------------------------------------------------------------ what the model reads and writes

    def model_state(self) -> ModelState | None:
        """The library model's batched state for the next forward call (``None`` before the first token).

        Raises ``ValueError`` when the rows sit at different positions (after padding); :attr:`rows` has them.
        """
        if self.rows is None:
            return None
        whole = self.rows.whole()
        if whole is None:
            raise ValueError(f"the rows of this cache sit at different positions {self.offsets()} (padding): there is "
                             f"no single batched state; TransformerVQCache.rows holds each row's")
        return whole

    def set_model_state(self, state: ModelState) -> None:
        """Store the state a forward call of the library model returned (every row at ``state.offset``)."""
        if len(state.layers) != self.n_units:
            raise ValueError(f"the model state has {len(state.layers)} units, this cache {self.n_units}")
        batch = next(t.shape[0] for s in state.layers if s is not None
                     for t in vars(s).values() if isinstance(t, torch.Tensor))
        self.rows, self.columns, self.consumed = RowStates.of(state, batch), state.offset, None

    def set_rows(self, rows: RowStates, input_ids: torch.Tensor) -> None:
        """Store each row's state after a call that consumed the columns ``input_ids`` ``[B, T]`` too."""
        if any(len(state.layers) != self.n_units for _, state in rows.groups):
            raise ValueError(f"the row states do not have this cache's {self.n_units} units")
        known = self.columns == 0 or self.consumed is not None
        self.consumed = fingerprint(input_ids, self.consumed) if known else None
        self.rows, self.columns = rows, self.columns + input_ids.shape[1]

    def check_consumed(self, input_ids: torch.Tensor) -> None:
        """Refuse ``input_ids`` ``[B, T]`` (a whole sequence given to ``generate`` with this cache) whose first
        columns are not the ones this cache consumed: it continues another sequence."""
        if self.consumed is None or input_ids.dim() != 2 or input_ids.shape[0] != self.consumed.shape[0]:
            return  # unknown, or a shape that forward's own checks refuse
        if input_ids.shape[1] < self.columns:
            raise ValueError(f"input_ids has {input_ids.shape[1]} columns, fewer than the {self.columns} this cache "
                             f"consumed: pass the whole sequence (past and new tokens, e.g. out.sequences) with its "
                             f"cache. {BRANCHES}")
        differ = (fingerprint(input_ids[:, :self.columns]) != self.consumed).nonzero().flatten().tolist()
        if differ:
            raise ValueError(f"the first {self.columns} columns of input_ids are not the ones this cache consumed "
                             f"(rows {differ}). {BRANCHES}")

    def offsets(self) -> list[int]:
        """Tokens consumed by each row (padding excluded)."""
        return [] if self.rows is None else self.rows.offsets()

    def nbytes(self) -> int:
        """Bytes held by the carried states."""
        return 0 if self.rows is None else self.rows.nbytes()

    # ------------------------------------------------------------------ transformers' cache API

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.columns

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    get_max_cache_shape = get_max_length

    def get_mask_sizes(self, query, layer_idx: int = 0) -> tuple[int, int]:
        return self.layers[0].get_mask_sizes(query)

    @property
    def is_initialized(self) -> bool:
        return self.rows is not None

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return 0 if self.rows is None else self.rows.batch

    max_batch_size = batch_size

    def reset(self) -> None:
        self.rows, self.columns, self.consumed = None, 0, None

    def crop(self, value: int) -> None:
        """A no-op when it removes nothing; refused otherwise: keys older than the window are summarized per code
        and cannot be taken out (so assisted decoding, which rolls back rejected tokens, is out)."""
        removes = self.columns - value if CROP_TAKES_LENGTH and value >= 0 else abs(value)
        if removes > 0:
            raise ValueError("a Transformer-VQ cache cannot drop tokens: keys before the current window are "
                             "summarized per code")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx.tolist())

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select([row for row in range(self.batch_size) for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        index = torch.arange(self.batch_size)[indices.cpu()].tolist()  # a mask or indices, as transformers passes
        self._select(index)

    def _select(self, index: list[int]) -> None:
        if self.rows is not None:
            self.rows = self.rows.select(index)
        if self.consumed is not None:
            self.consumed = self.consumed[torch.tensor(index, device=self.consumed.device)]

    def offload(self, *args, **kwargs) -> None:
        pass

    def prefetch(self, *args, **kwargs) -> None:
        pass
