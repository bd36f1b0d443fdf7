"""Field metadata and value checks shared by every config dataclass.

A config field is declared with :func:`option`, which stores its help text and its constraints on the field
itself (``dataclasses.Field.metadata``). The same constraints are checked when a config is built (from Python,
a file or ``--set``) and when a command-line flag is parsed (``transformer_vq.config.flags``), so one rule gives
one message wherever the value comes from. Kept free of torch so that ``tvq --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
import os
import re
import typing

# Integers go into tensors, seeds and sizes: anything above a signed 64-bit integer cannot be used.
MAX_INT = 2**63 - 1
NONE_WORDS = ("none", "null")
TRUE_WORDS = ("true", "yes", "1", "on")
FALSE_WORDS = ("false", "no", "0", "off")


class ConfigError(ValueError):
    """A configuration problem, with a message that says how to fix it.

    ``problems`` holds ``(field, text)`` pairs ("steps", "must be a positive integer, got 0"); the command line
    turns each field into its flag. A problem that ties several fields together has ``field`` None.
    """

    def __init__(self, message: str, problems: typing.Sequence[tuple[str | None, str]] = (), cls=None):
        super().__init__(message)
        self.problems = tuple(problems)
        self.cls = cls
        """The config class whose fields ``problems`` names."""

    def detail(self, flags: typing.Mapping[str, str] | None = None) -> str:
        """The problems without the config class's name (``d_model must be even, got 33``), for a message that says
        itself where they arose; a field in ``flags`` is named by the flag that set it (``--set d_model=33: must be
        even, got 33``). The whole message when it lists no problems."""
        flags = flags or {}
        parts = [text if name is None else f"{flags[name]}: {text}" if name in flags else f"{name} {text}"
                 for name, text in self.problems]
        return "; ".join(parts) or str(self)


def one_line(text: str) -> str:
    """``text`` as one line of an error: each line break, with the whitespace around it, becomes one space; other
    whitespace is kept (a quoted value ``'   '`` stays itself)."""
    return re.sub(r"\s*\n\s*", " ", text).strip()


def option(default=dataclasses.MISSING, help: str = "", *, factory=dataclasses.MISSING, **rules):
    """A dataclass field with its help text and rules: ``min``/``max`` (with ``min_open``/``max_open`` for
    strict bounds), ``choices``, ``training_only`` (model fields a resumed run may change), ``flag`` (a flag
    name other than the field's), ``k_suffix`` (lengths may be written ``8k``), ``allow_empty`` (a tuple may
    be empty), ``applies`` (the settings of other fields it applies under) and ``off`` (its value that asks for
    nothing, accepted everywhere; :mod:`transformer_vq.config.applies`), ``defines_data`` (a training field that
    defines the run's data: a resumed run may not change it), ``distinct`` (default true: a list names things to
    run or report once each, so a repeated value is refused; a dataset's options, declared elsewhere, may repeat)."""
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={"help": help, "distinct": True, **rules})


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a field holds, read from its annotation: ``base`` is int, float, str, bool, dict, or a dataclass;
    ``many`` marks ``tuple[base, ...]``; ``optional`` marks ``X | None``."""

    base: type
    optional: bool = False
    many: bool = False


@functools.lru_cache(maxsize=None)
def kinds(cls) -> dict[str, Kind]:
    """Every field's :class:`Kind` (annotations resolved once per class)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        optional = type(None) in args
        if optional:
            hint = next(a for a in args if a is not type(None))
        many = typing.get_origin(hint) is tuple
        base = typing.get_args(hint)[0] if many else (typing.get_origin(hint) or hint)
        out[name] = Kind(base, optional, many)
    return out


def fields_of(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def flag_of(field: dataclasses.Field) -> str:
    """The command-line flag of a field: ``block_len`` -> ``--block-len``."""
    return "--" + field.metadata.get("flag", field.name.replace("_", "-"))


def is_integer(value) -> bool:
    """Whether ``value`` is an integer: a Python, numpy or 0-d torch integer (what ``operator.index`` takes), not
    ``True`` or ``False`` (a flag passed by mistake) nor a float."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def is_real(value) -> bool:
    """Whether ``value`` is a real number: an integer (:func:`is_integer`), a Python or numpy float, or a 0-d torch
    or numpy array of floats (duck-typed: this package imports neither)."""
    if is_integer(value) or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        return True
    dtype = getattr(value, "dtype", None)
    return getattr(value, "ndim", None) == 0 and (getattr(dtype, "is_floating_point", None) is True
                                                  or getattr(dtype, "kind", None) == "f")


def as_python(value, base: type):
    """A numpy (or 0-d torch) number given for an ``int`` or ``float`` field, as the Python number it is: a config
    is compared, hashed and written as JSON, which numpy's numbers do not all survive. Anything else unchanged (its
    check refuses it)."""
    if base is int and is_integer(value) and type(value) is not int:
        return operator.index(value)
    if base is float and is_real(value) and type(value) is not float:  # np.float64 is a float, but not Python's
        return float(value)
    return value


def bounds_text(rules: dict, integer: bool) -> str | None:
    """A number's bounds (``rules``: a field's ``min``, ``max``, ``min_open``, ``max_open``) as its refusal says
    them: "must be a positive integer", "must be in (0, 1]"; None when there are none."""
    low, high = rules.get("min"), rules.get("max")
    if integer and low in (0, 1) and high is None:
        return "must be a positive integer" if low == 1 else "must be an integer >= 0"
    if low is not None and high is not None:
        left, right = "(" if rules.get("min_open") else "[", ")" if rules.get("max_open") else "]"
        return f"must be in {left}{low:g}, {high:g}{right}"
    if low is not None:
        return f"must be {'>' if rules.get('min_open') else '>='} {low:g}"
    if high is not None:
        return f"must be {'<' if rules.get('max_open') else '<='} {high:g}"
    return None


def outside_bounds(value, rules: dict) -> bool:
    """Whether ``value`` lies outside the bounds ``rules`` (as :func:`bounds_text` reads them)."""
    low, high = rules.get("min"), rules.get("max")
    if low is not None and (value <= low if rules.get("min_open") else value < low):
        return True
    return high is not None and (value >= high if rules.get("max_open") else value > high)


def _scalar_problem(value, base: type, rules: dict) -> str | None:
    """What is wrong with one value of type ``base`` under ``rules`` ("must be ..."), or None."""
    if base is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if base is int:
        if not is_integer(value):
            return "must be an integer"
        if abs(value) > MAX_INT:
            return f"is too large (at most {MAX_INT})"
    elif base is float:
        if not is_real(value):
            return "must be a number"
        if not math.isfinite(value):
            return "must be a finite number"
    elif base is str:
        if not isinstance(value, str):
            return "must be a string"
        if not value:
            return "must not be empty"
        if "choices" in rules and value not in rules["choices"]:
            return f"must be one of {', '.join(rules['choices'])}"
        return file_stem_problem(value) if rules.get("file_stem") else None
    elif base is dict:
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
        return None if ok else "must be a mapping of option name to value"
    else:
        return None if isinstance(value, base) else f"must be a {base.__name__}"
    return bounds_text(rules, base is int) if outside_bounds(value, rules) else None


def file_stem_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the stem of files written in a chosen directory (``--name``), or None: a path
    (a separator, ``.``, ``..``) would write elsewhere than that directory, an empty stem hidden files (``.json``)."""
    if not name.strip():
        return "must not be empty"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "must be a file name stem, not a path (the directory is --out)"
    return None


def problem(field: dataclasses.Field, kind: Kind, value) -> str | None:
    """What is wrong with ``value`` for ``field`` ("must be a positive integer"), or None when it is fine."""
    if value is None:
        return None if kind.optional else "must be given (none is not allowed)"
    if not kind.many:
        return _scalar_problem(value, kind.base, field.metadata)
    if not isinstance(value, tuple) or not (value or field.metadata.get("allow_empty")):
        return "must be a non-empty list"
    repeated = [v for i, v in enumerate(value) if v in value[:i]] if field.metadata.get("distinct") else []
    if repeated:  # a config's list names things to run or report once each: a repeat would be counted twice
        return f"must not repeat a value ({repeated[0]!r} given twice)"
    return next((_scalar_problem(v, kind.base, field.metadata) for v in value
                 if _scalar_problem(v, kind.base, field.metadata)), None)


def _settled(value, kind: Kind):
    """``value`` with its numpy numbers as Python numbers (:func:`as_python`); ``value`` itself when it has none."""
    if kind.many and isinstance(value, tuple):
        items = tuple(as_python(v, kind.base) for v in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    return as_python(value, kind.base)


def check(obj, extra: typing.Sequence[tuple[str | None, str]] = ()) -> None:
    """Check every field of a config against its rules, plus the class's own cross-field ``extra`` problems;
    raise one :class:`ConfigError` that lists them all. A numpy number given for a number field is stored as the
    Python number it is first (:func:`as_python`)."""
    found = []
    for name, kind in kinds(type(obj)).items():
        value = getattr(obj, name)
        settled = _settled(value, kind)
        if settled is not value:
            object.__setattr__(obj, name, settled)  # frozen: set once, in __post_init__, before anyone reads it
            value = settled
        text = problem(fields_of(type(obj))[name], kind, value)
        if text:
            found.append((name, f"{text}, got {value!r}"))
    found += [p for p in extra if p]
    if found:
        detail = "; ".join(text if name is None else f"{name} {text}" for name, text in found)
        raise ConfigError(f"invalid {type(obj).__name__}: {detail}", found, type(obj))


def parse_scalar(text: str, base: type, rules: dict):
    """One command-line or ``--set`` word as a value of type ``base``; raises ValueError with a message
    ("must be an integer, got 'ten'")."""
    word = text.strip()
    if base is bool:
        if word.lower() in TRUE_WORDS + FALSE_WORDS:
            return word.lower() in TRUE_WORDS
        raise ValueError(f"must be true or false, got {text!r}")
    if base is int:
        scale = 1024 if rules.get("k_suffix") and word.lower().endswith("k") else 1
        digits = word[:-1] if scale > 1 else word
        if not re.fullmatch(r"[+-]?\d+", digits):
            hint = " (digits only, without a decimal point or exponent)" if re.fullmatch(
                r"[+-]?[\d.]+(e[+-]?\d+)?", digits.lower()) else ""
            raise ValueError(f"must be an integer{hint}, got {text!r}")
        return int(digits) * scale
    if base is float:
        try:
            value = float(word)
        except ValueError:
            raise ValueError(f"must be a number, got {text!r}") from None
        if math.isinf(value) and "inf" not in word.lower():
            raise ValueError(f"is too large (overflows a float), got {text!r}")
        if value == 0 and re.search(r"[1-9]", word.lower().split("e")[0]):
            raise ValueError(f"is too small (underflows to 0), got {text!r}")
        return value
    return text


def parse_text(field: dataclasses.Field, kind: Kind, text: str | typing.Sequence[str]):
    """A flag's (or an override's) text as the field's typed value, checked against the field's rules;
    ``none`` gives None for an optional field. Raises ValueError with "what is wrong, got VALUE"."""
    if kind.optional and isinstance(text, str) and text.strip().lower() in NONE_WORDS:
        return None
    if kind.many:
        words = text.replace(",", " ").split() if isinstance(text, str) else list(text)
        value = tuple(parse_scalar(w, kind.base, field.metadata) for w in words)
    else:
        value = parse_scalar(text, kind.base, field.metadata)
    wrong = problem(field, kind, value)
    if wrong:
        raise ValueError(f"{wrong}, got {text!r}" if isinstance(text, str) else f"{wrong}, got {value!r}")
    return value


def coerce(field: dataclasses.Field, kind: Kind, value):
    """A value read from a config file or JSON (already typed by YAML/TOML) in the field's type: strings are
    parsed as on the command line, lists become tuples, integers become floats for float fields."""
    if isinstance(value, str) and kind.base is not str:
        return parse_text(field, kind, value)
    if kind.many and isinstance(value, list):
        return tuple(value)
    if kind.base is float and is_integer(value) and abs(value) <= MAX_INT:
        return float(value)
    return value


def png_path_problem(path) -> str | None:
    """Why a figure cannot be written at ``path`` (None when it can): the library writes PNG, so a name with another
    suffix (``cm.jpg``) would hold PNG bytes under a name that says otherwise. No suffix, or a directory, is fine."""
    suffix = os.path.splitext(str(path))[1]
    if suffix and suffix.lower() != ".png" and not os.path.isdir(path):
        return f"figures are written as PNG, and {str(path)!r} names a {suffix} file: name it .png (or a directory)"
    return None


def unknown_message(keys, what, known) -> str:
    """An unknown key named, with every key that would have been known."""
    return f"unknown {what} key(s): {', '.join(sorted(keys))}; known keys: {', '.join(sorted(known))}"


def build(cls, values: dict, section: str):
    """Instantiate ``cls`` from ``values`` (typed, or strings as on the command line); bad keys and values are
    named as ``section.key``."""
    known = fields_of(cls)
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(unknown_message(unknown, f"{section} config", known))
    converted = {}
    for key, value in values.items():
        try:
            converted[key] = coerce(known[key], kinds(cls)[key], value)
        except ValueError as err:
            raise ConfigError(f"{section}.{key} {err}", [(key, str(err))], cls) from None
    return cls(**converted)
