"""Which model fields a benchmark reads: the check that refuses a model flag a benchmark would silently ignore.

A benchmark runs kinds of cells (``tvq bench op``: one per method; ``train`` and ``decode``: one per model of
``--models``; ``longvq``: one per block kind), and each kind reads some of its model's fields. A benchmark config
describes its kinds of cells as :class:`Cell` values (``BenchConfig.cells``): the model's fields as the cell runs them,
and the fields it never reads, each with why. A model field the user gives (a flag) is refused when no cell honors it:
in every cell it either applies nowhere (the check ``tvq train`` applies to the options it is given,
:func:`~transformer_vq.config.applies.given_problems`) or is not read. The fields not read are declared by what is
read where that is short (``op``), so a model field added later is refused until a benchmark reads it. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from transformer_vq.config.applies import given_problems, unmet
from transformer_vq.config.fields import check, fields_of


@dataclass(frozen=True)
class Cell:
    """One kind of cell of a benchmark, as far as its model goes."""

    context: Mapping[str, object]
    """The model's fields as the cell runs them (those the benchmark sets per cell included): where the fields'
    ``applies`` conditions are looked up."""
    unread: Mapping[str, str]
    """Model fields the cell never reads -> why, as the refusal says it."""
    sets: Mapping[str, str]
    """Model fields the benchmark sets for this cell -> the flag that sets them (``attn_type`` -> ``--models``)."""


def unread_problems(model_cls, cells: Iterable[Cell], given: Iterable[str]) -> list[tuple[str, str]]:
    """``(field, why)`` for each model field in ``given`` that no cell of ``cells`` honors; the reason is the first
    cell's."""
    cells = list(cells)
    found = []
    for name in sorted(set(given) & set(fields_of(model_cls))):
        reasons = [_why_not(model_cls, cell, name) for cell in cells]
        if cells and all(reasons):
            found.append((name, reasons[0]))
    return found


def _why_not(model_cls, cell: Cell, name: str) -> str | None:
    """Why ``cell`` does not honor model field ``name`` (None when it does)."""
    refused = given_problems(model_cls, [name], cell.context)
    if not refused:
        return cell.unread.get(name)
    # the refusal says to set the fields the option needs; say which flag sets those the benchmark sets per cell
    missed = [m.split()[0] for m in unmet(fields_of(model_cls)[name], cell.context)]
    setters = [f"{cell.sets[m]} sets {m}" for m in missed if m in cell.sets]
    return refused[0][1] + (f" (here {' and '.join(setters)})" if setters else "")


def refuse_unread(model, cells: Iterable[Cell], given: Iterable[str]) -> None:
    """Raise :class:`~transformer_vq.config.ConfigError` (naming each flag) when a model field in ``given`` is one
    no cell honors; ``model`` the benchmark's model config."""
    check(model, unread_problems(type(model), cells, given))
