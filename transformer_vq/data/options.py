"""Dataset options (``--data-option KEY=VALUE``, or keywords of ``load_corpus`` / ``load_classification``): each
declared once, in its loader's signature, and checked against that declaration before the loader does any work.

The annotation is the option's type; ``Annotated[T, Rules(...)]`` adds its range or choices, in the rules of the
config fields (``min``, ``max``, ``min_open``, ``max_open``, ``choices``: :func:`transformer_vq.config.fields.option`),
so a dataset option and a config field with the same rule give the same message. :func:`checked_options` reads the
declarations: a value written on the command line as text is parsed as its declared type (``n_train=2k`` is refused,
``n_train=2000`` is the integer), a value of the wrong type or outside its range is refused naming the dataset, the
option, the value and the rule.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import os
import pathlib
import types
import typing

from transformer_vq.config.fields import Kind, parse_scalar, problem
from transformer_vq.data.errors import DataError



@dataclasses.dataclass(frozen=True)
class Rules:
    """The range or choices of a dataset option, as ``Annotated`` metadata (hashable, as typing needs)."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    choices: tuple[str, ...] | None = None
    what: str | None = None
    """The rule in words, for the message, where the type and range alone would say less ("three positive numbers
    summing to 1")."""
    with_data_path: bool | None = None
    """Where the option applies: True only with ``data_path`` (it picks among released files), False only without
    it (it shapes generated or fetched data), None either way. Given where it does not apply, it is refused rather
    than ignored (:func:`refuse_misplaced`)."""

    def as_dict(self) -> dict:
        """The rules a config field would hold in its metadata: those set away from their defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}


Positive = typing.Annotated[int, Rules(min=1)]
"""A size or count that must be at least 1."""
NonNegative = typing.Annotated[int, Rules(min=0)]
"""A seed, or a count that may be 0."""
WITH_PATH = Rules(with_data_path=True)
"""Added to an option's annotation (``Annotated[str, WITH_PATH]``): it applies only with ``data_path``."""
WITHOUT_PATH = Rules(with_data_path=False)
"""Added to an option's annotation (``Annotated[Positive, WITHOUT_PATH]``): it applies only without ``data_path``."""
Fractions = typing.Annotated[typing.Sequence[float], Rules(
    min=0.0, max=1.0, min_open=True, what="three positive numbers (train, validation, test) summing to 1")]
"""Train/validation/test fractions of a contiguous split."""

NOT_OPTIONS = ("data_path", "cache_dir")
"""Loader parameters that are not dataset options (``--data-path``, ``--cache-dir``)."""


def declaration(hint) -> tuple[Kind, dict]:
    """The :class:`~transformer_vq.config.fields.Kind` and rules an annotation declares: ``Annotated`` rules,
    ``X | None`` optional, a sequence or tuple ``many``, a mapping ``dict``, a path (``str | os.PathLike``) ``str``."""
    rules, optional = {}, False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = len(members) < len(typing.get_args(hint)), members[0]
    if typing.get_origin(hint) is typing.Annotated:  # Annotated[Positive, WITHOUT_PATH]: one Rules each, merged
        hint, *metadata = typing.get_args(hint)
        rules = {k: v for r in metadata if isinstance(r, Rules) for k, v in r.as_dict().items()}
    origin = typing.get_origin(hint)
    if origin in (tuple, list, collections.abc.Sequence):
        element, element_rules = declaration(typing.get_args(hint)[0])
        return Kind(element.base, optional, many=True), {**element_rules, **rules}
    if origin in (dict, collections.abc.Mapping):
        return Kind(dict, optional), rules
    return Kind(hint if hint in (int, float, bool, str) else str, optional), rules


def declared(function) -> dict[str, tuple[Kind, dict]]:
    """Every option of loader ``function``, by name: its kind and rules."""
    hints = typing.get_type_hints(function, include_extras=True)
    return {name: declaration(hints.get(name, str)) for name in inspect.signature(function).parameters
            if name not in NOT_OPTIONS}


def typed(value, kind: Kind, rules: dict):
    """``value`` as its declared kind: text (from the command line) parsed as a number or a bool, a list as a tuple,
    a number given for a text option as its text; anything else as it is (the check names what is wrong)."""
    if isinstance(value, list) and kind.many:
        return tuple(typed(v, Kind(kind.base), rules) for v in value)
    if isinstance(value, str) and kind.base in (int, float, bool) and not kind.many:
        return parse_scalar(value, kind.base, rules)
    if kind.base is str and not kind.many and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind.base is str and isinstance(value, os.PathLike):  # a path option given as a Path, from Python
        return os.fspath(value)
    return value


def checked_options(name: str, function, options: dict) -> dict:
    """``options`` of dataset ``name`` (loaded by ``function``) as their declared types; :class:`DataError` naming
    the dataset, the option, the value and the rule for an unknown option or a value its declaration refuses."""
    known = declared(function)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DataError(f"dataset {name!r} has no option {', '.join(map(repr, unknown))}; "
                        f"its options are: {', '.join(known) or 'none'}")
    out = {}
    for key, value in options.items():
        kind, rules = known[key]
        try:
            out[key] = typed(value, kind, rules)
            wrong = problem(dataclasses.field(metadata=rules), kind, out[key])
        except ValueError as err:  # text that does not parse: its message says what it must be
            wrong = str(err).rsplit(", got ", 1)[0]
        if wrong and "what" in rules:
            wrong = f"must be {rules['what']}"
        if wrong:
            default = inspect.signature(function).parameters[key].default
            raise DataError(f"dataset {name!r}: option {key} {wrong}, got {value!r}; pass --data-option "
                            f"{key}=VALUE with such a value, or leave it out (default {default!r})")
    return out


def refuse_misplaced(name: str, function, options: dict, data_path) -> None:
    """Refuse (:class:`DataError`) an option of ``options`` that does not apply with this ``data_path`` (given or
    None), by its declaration (``Rules.with_data_path``): the loader would ignore it, and the run would record it."""
    known = declared(function)
    for key in options:
        where = known[key][1].get("with_data_path") if key in known else None
        if where is None or where == (data_path is not None):
            continue
        if where:
            raise DataError(f"dataset {name!r}: option {key} applies only with --data-path (it picks among the "
                            f"released files) and none was given; leave --data-option {key} out, or pass "
                            f"--data-path with the release")
        raise DataError(f"dataset {name!r}: option {key} applies only without --data-path (it shapes the generated "
                        f"or fetched data) and --data-path was given; leave --data-option {key} out, or leave out "
                        f"--data-path")


def identity(name: str, function, data_path, options: dict) -> dict:
    """What identifies the data that ``function(data_path, **options)`` of dataset ``name`` loads: the name, the
    resolved path and every option as its declared type, the defaults filled in (whether an option was given or
    left at its default loads the same data), in the fields of a training config (``data``, ``data_path``,
    ``data_options``)."""
    defaults = {key: parameter.default for key, parameter in inspect.signature(function).parameters.items()
                if key not in NOT_OPTIONS}
    path = None if data_path is None else str(pathlib.Path(data_path).expanduser().resolve())
    return {"data": name, "data_path": path, "data_options": {**defaults, **checked_options(name, function, options)}}
