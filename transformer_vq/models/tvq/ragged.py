"""Ragged batches: rows with padding between their tokens, or with several sequences one after another (packed
documents), run so that every sequence gets exactly what it gets alone.

Masking is not enough. A causal operator's state carries one offset for its whole batch, and where a token falls in
the block grid (which keys are in its two-block window, which are summarized per code, which chunk FLASH sums it in)
depends on its position in its own sequence. A prompt left-padded by ``p`` positions would have its blocks cut ``p``
positions off and get other numbers than alone. So padding never enters the model here: each row's real tokens are
taken out in *segments* (the tokens of one sequence in one call), segments at the same offset and of the same length
run together as one batch, and their outputs go back to their columns. Padding takes no part in attention, the
compressive cache, the commitment loss or the codebook statistics, and nothing flows from one packed sequence into
the next.

The price: a call runs one model call per distinct ``(offset, length)``, so a batch whose rows sit at ``k`` different
positions decodes with ``k`` calls per token. A batch without padding is one group: one call, as without this module.

Legend: ``B`` rows and ``T`` columns of a call, ``n`` tokens of a segment, ``g`` segments in a group, ``V`` vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from transformer_vq.models.tvq.model import TransformerVQ
from transformer_vq.nn.inputs import IGNORE_INDEX
from transformer_vq.nn.outputs import module_output
from transformer_vq.nn.state import ModelState



# ---------------------------------------------------------------------------------------------- states per row

def map_unit_state(state, fn: Callable[[torch.Tensor], torch.Tensor]):
    """A copy of one unit's operator state (a dataclass, batch-first tensors) with ``fn`` applied to each tensor."""
    return dataclasses.replace(state, **{
        f.name: fn(getattr(state, f.name)) for f in dataclasses.fields(state)
        if isinstance(getattr(state, f.name), torch.Tensor)
    })


def select_rows(state: ModelState, index: Sequence[int]) -> ModelState:
    """The rows ``index`` of a batched model state (copies)."""
    first = next(s for s in state.layers if s is not None)
    device = next(getattr(first, f.name) for f in dataclasses.fields(first)
                  if isinstance(getattr(first, f.name), torch.Tensor)).device
    index_t = torch.tensor(list(index), dtype=torch.long, device=device)
    return ModelState(state.offset, [None if s is None else map_unit_state(s, lambda t: t.index_select(0, index_t))
                                     for s in state.layers],
                      positions=None if state.positions is None else state.positions.index_select(0, index_t))


def cat_rows(states: Sequence[ModelState]) -> ModelState:
    """One batched state of several states at the same offset, rows in order."""
    if len({s.offset for s in states}) != 1:
        raise ValueError(f"only states at the same offset can share a batch, got offsets {[s.offset for s in states]}")
    if len(states) == 1:
        return states[0]
    layers = []
    for unit_states in zip(*(s.layers for s in states)):
        if unit_states[0] is None:
            layers.append(None)
            continue
        fields = {}
        for f in dataclasses.fields(unit_states[0]):
            values = [getattr(u, f.name) for u in unit_states]
            if isinstance(values[0], torch.Tensor):
                fields[f.name] = torch.cat(values, dim=0)
            elif "rows" in f.metadata:  # a field that says how rows combine (a flag: any of them)
                fields[f.name] = f.metadata["rows"](values)
            elif any(v != values[0] for v in values):
                raise ValueError(f"unit states disagree on {f.name} ({values}); they cannot share a batch")
            else:
                fields[f.name] = values[0]
        layers.append(type(unit_states[0])(**fields))
    positions = [s.positions for s in states]
    if any(p is None for p in positions) and any(p is not None for p in positions):
        raise ValueError("only states that all hold their rows' document positions (or none does) can share a batch")
    return ModelState(states[0].offset, layers, positions=None if positions[0] is None else torch.cat(positions))


class RowStates:
    """The states of a batch's rows when the rows may sit at different positions.

    Rows that ran together are kept together: a list of groups, each a tuple of rows and one batched
    :class:`ModelState` of them (all at one offset). A batch that never had padding is one group, its state the
    model's own. A row in no group has consumed no token yet. Immutable: every change returns a new object.
    """

    def __init__(self, batch: int, groups: Sequence[tuple[tuple[int, ...], ModelState]] = ()):
        self.batch = batch
        self.groups = tuple((tuple(rows), state) for rows, state in groups)
        seen = [row for rows, _ in self.groups for row in rows]
        if len(seen) != len(set(seen)) or any(not 0 <= row < batch for row in seen):
            raise ValueError(f"each of the {batch} rows belongs to at most one group, "
                             f"got {[g[0] for g in self.groups]}")
        self._where = {row: (i, j) for i, (rows, _) in enumerate(self.groups) for j, row in enumerate(rows)}

    @classmethod
    def of(cls, state: ModelState | None, batch: int) -> "RowStates":
        """The rows of one batched state (``None``: ``batch`` rows with no tokens yet)."""
        return cls(batch, [] if state is None else [(tuple(range(batch)), state)])

    def offsets(self) -> list[int]:
        """Tokens consumed by each row."""
        return [self.groups[self._where[row][0]][1].offset if row in self._where else 0 for row in range(self.batch)]

    def whole(self) -> ModelState | None:
        """The one batched state of every row in order, when the rows are one group (else ``None``)."""
        if len(self.groups) == 1 and self.groups[0][0] == tuple(range(self.batch)):
            return self.groups[0][1]
        return None

    def gather(self, rows: Sequence[int]) -> ModelState:
        """One batched state of ``rows`` (which must all hold a state at the same offset)."""
        rows = tuple(rows)
        missing = [row for row in rows if row not in self._where]
        if missing:
            raise ValueError(f"rows {missing} hold no state to continue")
        for group_rows, state in self.groups:
            if group_rows == rows:
                return state  # the rows ran together last time: no copy
        return cat_rows([select_rows(self.groups[i][1], [j]) for i, j in (self._where[row] for row in rows)])

    def with_rows(self, rows: Sequence[int], state: ModelState) -> "RowStates":
        """These states with ``rows`` (in order) holding the batched ``state``."""
        rows = tuple(rows)
        taken = set(rows)
        groups = []
        for group_rows, group_state in self.groups:
            keep = [j for j, row in enumerate(group_rows) if row not in taken]
            if len(keep) == len(group_rows):
                groups.append((group_rows, group_state))
            elif keep:
                groups.append((tuple(group_rows[j] for j in keep), select_rows(group_state, keep)))
        return RowStates(self.batch, [*groups, (rows, state)])

    def select(self, index: Sequence[int]) -> "RowStates":
        """A batch whose row ``i`` is this batch's row ``index[i]`` (reordering, repeating, selecting rows)."""
        groups = []
        for group_rows, state in self.groups:
            position = {row: j for j, row in enumerate(group_rows)}
            picked = [(i, position[old]) for i, old in enumerate(index) if old in position]
            if picked:
                new_rows, local = zip(*picked)
                same = list(local) == list(range(len(group_rows)))
                groups.append((new_rows, state if same else select_rows(state, local)))
        return RowStates(len(index), groups)

    def detach(self) -> "RowStates":
        """The same states cut from the autograd graph."""
        return RowStates(self.batch, [(rows, state.detach()) for rows, state in self.groups])

    def nbytes(self) -> int:
        """Bytes held by the states."""
        return sum(state.nbytes() for _, state in self.groups)


# ---------------------------------------------------------------------------------------------- segments

@dataclass(frozen=True)
class Segment:
    """The tokens of one sequence in one row of a call."""

    row: int
    columns: tuple[int, ...]
    """The call's columns holding the tokens, ascending."""
    offset: int
    """Tokens of the sequence before these: the row's state continues it (``> 0``) or it starts here (``0``)."""
    last: bool
    """The row's last segment in this call: the state after it is the row's state."""


def plan_segments(row_offsets: Sequence[int], length: int, *, mask: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None) -> list[Segment]:
    """Cut a call of ``length`` columns into segments.

    Args:
        row_offsets: tokens each row's carried state has consumed (0: no state).
        mask: ``[B, T]``, true for real tokens; padding belongs to no segment. ``None``: every column is real.
        positions: ``[B, T]`` the position of each token in its own sequence. A real token at position 0 starts a
            new sequence (packed documents); any other token must follow the one before it. ``None``: each row's
            tokens continue its state.

    Raises ``ValueError`` where the positions contradict the states: above all, a call whose positions say it
    continues a sequence of which no state arrived.
    """
    if is_plain(row_offsets, length, mask, positions):  # the common case, without a loop over tokens
        return [Segment(row, tuple(range(length)), offset, True) for row, offset in enumerate(row_offsets)]
    mask_rows = None if mask is None else mask.bool().tolist()
    position_rows = None if positions is None else positions.tolist()
    segments = []
    for row, row_offset in enumerate(row_offsets):
        runs: list[tuple[int, list[int]]] = []  # (offset, columns) of each sequence in the row
        for column in range(length):
            if mask_rows is not None and not mask_rows[row][column]:
                continue
            expected = runs[-1][0] + len(runs[-1][1]) if runs else row_offset
            position = expected if position_rows is None else position_rows[row][column]
            if position == expected and runs:
                runs[-1][1].append(column)
            elif position == expected or position == 0:
                runs.append((position, [column]))
            else:
                raise ValueError(position_error(row, column, position, expected, continues=not runs))
        segments += [Segment(row, tuple(columns), offset, last=i == len(runs) - 1)
                     for i, (offset, columns) in enumerate(runs)]
    return segments


def is_plain(row_offsets: Sequence[int], length: int, mask: torch.Tensor | None,
             positions: torch.Tensor | None) -> bool:
    """No padding, and every row's positions continue its state."""
    if mask is not None and not bool(mask.bool().all()):
        return False
    if positions is None:
        return True
    expected = torch.tensor(list(row_offsets), device=positions.device)[:, None] + torch.arange(
        length, device=positions.device)  # (B, T)
    return bool((positions == expected).all())


def position_error(row: int, column: int, position: int, expected: int, *, continues: bool) -> str:
    where = f"row {row}, column {column}: position {position}"
    if continues and expected == 0:
        return (f"{where} continues a sequence of {position} earlier tokens, but no state of it arrived; pass the "
                f"cache (state) the previous call returned, or position 0 to start a new sequence")
    if continues:
        return (f"{where}, but the state carried for this row has consumed {expected} tokens; pass the state of the "
                f"same sequence, or position 0 to start a new one (transformers' generate counts every column the "
                f"attention mask marks real into the positions it passes: pad prompts on the left, and when "
                f"continuing a padded batch pass its attention mask again, the prompts' followed by ones)")
    return (f"{where} follows a token at position {expected - 1}; positions must count up by one within a sequence "
            f"and restart at 0 where a new one begins")


# ---------------------------------------------------------------------------------------------- running

@module_output
@dataclass
class RaggedOutput:
    """What :func:`run_segments` returns for a ragged call: logits per column, the rows' states and the losses."""

    logits: torch.Tensor
    """``[B, T, V]``. A padded column holds the logits of the row's last real token before it (what comes next in
    the row's sequence so far: right-padded prompts continue correctly); zero before a row's first real token."""
    states: RowStates
    """Each row's state after the call (rows without a token keep theirs)."""
    commit_loss: torch.Tensor
    """Per-token commitment loss over every real token (the model's ``commit_loss``, averaged over groups)."""
    ce_loss: torch.Tensor | None = None
    """Mean cross-entropy over the tokens with a target, when labels are given."""
    loss: torch.Tensor | None = None
    """``ce_loss + commit_coef * commit_loss``, when labels are given."""


def run_segments(model: TransformerVQ, input_ids: torch.Tensor, segments: Sequence[Segment], states: RowStates, *,
                 labels: torch.Tensor | None = None) -> RaggedOutput:
    """Run every segment of ``input_ids`` ``[B, T]`` as its own sequence, continuing the row states it continues.

    ``labels`` ``[B, T]``: the token a column's successor *in the same segment* must predict is that successor's
    label (``IGNORE_INDEX``: none), so no loss crosses padding or a boundary between packed sequences. The losses
    are the model's (Eq. 35) over all groups: cross-entropy averaged over targets, commitment over tokens.
    """
    B, T = input_ids.shape
    groups: dict[tuple[int, int], list[Segment]] = {}
    for segment in segments:
        groups.setdefault((segment.offset, len(segment.columns)), []).append(segment)
    if not groups:
        raise ValueError("the call holds no real token (the attention mask is all zeros)")
    logits, commit_parts, ce_parts, outputs = None, [], [], []
    for (offset, n), group in groups.items():
        rows = [s.row for s in group]
        whole = rows == list(range(B)) and n == T  # no padding: the inputs as they are, no gather
        if not whole:
            row_index = torch.tensor(rows, device=input_ids.device)[:, None]  # (g, 1)
            col_index = torch.tensor([s.columns for s in group], device=input_ids.device)  # (g, n)
        ids = input_ids if whole else input_ids[row_index, col_index]  # (g, n)
        targets = loss_mask = None
        if labels is not None:
            group_labels = labels if whole else labels[row_index, col_index]  # (g, n)
            next_labels = torch.cat([group_labels[:, 1:], group_labels.new_full((len(group), 1), IGNORE_INDEX)], 1)
            loss_mask = next_labels != IGNORE_INDEX
            targets = next_labels.masked_fill(~loss_mask, 0)
        out = model(ids, states.gather(rows) if offset > 0 else None, targets=targets, loss_mask=loss_mask)
        outputs.append(out)
        if whole:
            logits = out.logits
        else:
            if logits is None:
                logits = out.logits.new_zeros(B, T, out.logits.shape[-1])
            logits = logits.index_put((row_index, col_index), out.logits)
        last = [j for j, s in enumerate(group) if s.last]
        if out.state is not None and last:
            state = out.state if len(last) == len(group) else select_rows(out.state, last)
            states = states.with_rows([group[j].row for j in last], state)
        commit_parts.append((out.commit_loss, len(group) * n))
        if loss_mask is not None:
            ce_parts.append((out.ce_loss, int(loss_mask.sum())))
    if not (len(outputs) == 1 and logits is outputs[0].logits):
        logits = carry_into_padding(logits, segments)
    if len(outputs) == 1:  # one group: the model's own numbers, bit for bit
        only = outputs[0]
        return RaggedOutput(logits, states, only.commit_loss, only.ce_loss, only.loss)
    commit_loss = weighted_mean(commit_parts)
    result = RaggedOutput(logits, states, commit_loss)
    if labels is not None:
        result.ce_loss = weighted_mean(ce_parts)
        result.loss = result.ce_loss + model.cfg.commit_coef * commit_loss
    return result


def carry_into_padding(logits: torch.Tensor, segments: Sequence[Segment]) -> torch.Tensor:
    """Each padded column takes the logits of the last real column before it in its row (zero before the first)."""
    B, T, _ = logits.shape
    real = torch.zeros(B, T, dtype=torch.bool, device=logits.device)
    for segment in segments:
        real[segment.row, list(segment.columns)] = True
    columns = torch.arange(T, device=logits.device).expand(B, T)
    last = torch.where(real, columns, torch.full_like(columns, -1)).cummax(dim=1).values  # (B, T)
    carried = logits.gather(1, last.clamp(min=0)[..., None].expand_as(logits))
    return torch.where((last >= 0)[..., None], carried, torch.zeros_like(logits))


def weighted_mean(parts: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """``sum(value * weight) / sum(weight)`` (0 when every weight is 0, as the model's masked mean)."""
    total = sum(weight for _, weight in parts)
    return sum(value * weight for value, weight in parts) / max(total, 1)
