"""Command-line flags generated from config dataclasses: one typed flag per field, flat style (``block_len`` ->
``--block-len``), with the field's help text and rules (``transformer_vq.config.fields``).

- numbers and strings: ``--steps 100``; a value that breaks the field's rule is refused while parsing, as
  ``error: --steps: must be a positive integer, got '0'`` (exit 2);
- enumerations: ``--attn-type {vq,full,flash_quad,flash}``;
- booleans: ``--abs-pos`` / ``--no-abs-pos``;
- optional fields accept ``none``: ``--lr none``;
- tuples take several values: ``--lengths 2k 8k`` (a ``k`` suffix where the field allows it);
- mappings are a repeatable ``KEY=VALUE`` flag: ``--data-option tokenizer=pg19.model``.

Only flags given on the command line land in the parsed namespace (their defaults are suppressed), so
:func:`given` returns exactly the values the user typed, already typed, for ``dataclasses.replace``.
Kept free of torch so that ``tvq --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import tempfile
from pathlib import Path

from transformer_vq.config.fields import (ConfigError, bounds_text, fields_of, flag_of, kinds, one_line,
                                          outside_bounds, parse_scalar, parse_text)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``error: --FLAG: what is wrong``, exit status 2.

    Abbreviated long options are refused (``--st`` is not ``--steps``): an abbreviation that is unique today becomes
    ambiguous, or silently means another option, when a flag is added. Subcommand parsers are of this class too
    (argparse builds them with the parent's class), so the rule holds everywhere.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unknown argument is answered with the help of the (sub)command that was given it:
        ``see tvq classify train --help``, not the top level's."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.exit(2, f"error: unrecognized arguments: {' '.join(extras)}; see {self._chosen(namespace).prog} "
                         f"--help\n")
        return namespace

    def _chosen(self, namespace) -> argparse.ArgumentParser:
        """The deepest subcommand parser ``namespace`` was parsed by (this parser when none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(namespace, action.dest, None) or "")
                if sub is not None:
                    return sub._chosen(namespace) if isinstance(sub, Parser) else sub
        return self

    def error(self, message: str):
        found = re.match(r"argument (-[^/:\s]+)[^:]*: (.*)", message, re.S)
        line = f"{found.group(1)}: {found.group(2)}" if found else f"{message}; see {self.prog} --help"
        if found and found.group(2).strip() == "expected one argument":  # argparse reads `--lr -1e-3` as two flags
            line += f" (a negative value is written {found.group(1)}=-X)"
        self.exit(2, f"error: {one_line(line)}\n")


def _converter(field: dataclasses.Field, kind):
    def convert(text: str):
        try:
            return parse_text(field, kind, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = field.name
    return convert


def _metavar(field: dataclasses.Field, kind) -> str:
    if "choices" in field.metadata:
        word = "{" + ",".join(field.metadata["choices"]) + "}"
    else:
        word = {int: "N", float: "X"}.get(kind.base, "TEXT")
    return f"{word}|none" if kind.optional else word


def add_flags(parser, cls, *, defaults: str | None = None, skip: tuple[str, ...] = ()) -> None:
    """Add one flag per field of the dataclass ``cls`` to ``parser`` (or an argument group). ``defaults``
    replaces the "(default: ...)" of every help text (e.g. "the preset's"; "" leaves it out, for a group whose
    title says it); ``skip`` names fields left out."""
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        kind = kinds(cls)[field.name]
        suffix = "" if defaults == "" else f" (default: {defaults or _default_text(field)})"
        helptext = f"{field.metadata.get('help', '')}{suffix}".replace("%", "%%")
        common = dict(dest=field.name, default=argparse.SUPPRESS, help=helptext)
        if kind.base is bool:
            parser.add_argument(flag_of(field), action=argparse.BooleanOptionalAction, **common)
        elif kind.base is dict:
            parser.add_argument(flag_of(field), action="append", metavar="KEY=VALUE", **common)
        elif kind.many:
            parser.add_argument(flag_of(field), nargs="+",
                                type=_converter(field, dataclasses.replace(kind, many=False)),
                                metavar=_metavar(field, kind), **common)
        else:
            parser.add_argument(flag_of(field), type=_converter(field, kind), metavar=_metavar(field, kind), **common)


def _default_text(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return "none"
    value = field.default
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return "none" if value is None else repr(value) if isinstance(value, str) else str(value)


def given(args: argparse.Namespace, cls) -> dict:
    """The values of ``cls``'s fields given as flags, typed (a mapping flag's items parsed as KEY=VALUE)."""
    from transformer_vq.config.load import parse_data_options

    values = {}
    for name, kind in kinds(cls).items():
        if hasattr(args, name):
            value = getattr(args, name)
            values[name] = parse_data_options(value) if kind.base is dict else \
                tuple(value) if kind.many else value
    return values


def flag_message(err: ConfigError) -> str:
    """A config error in flag terms: ``--steps: must be a positive integer, got 0`` for a problem of one field of a
    known class (or of a config it nests, named ``model.causal``: :func:`nested_flag`), a problem of several fields
    as it is worded (it names its flags itself), without the config class's name, which a command-line user never
    typed; the error's own message when it lists no problems."""
    if not err.problems or err.cls is None:
        return str(err)
    return "; ".join(text if name is None else f"{nested_flag(err.cls, name)}: {text}" for name, text in err.problems)


def nested_flag(cls, name: str) -> str:
    """The flag of field ``name`` of ``cls``, or of a config ``cls`` nests: ``model.causal`` -> ``--causal`` (a
    benchmark's model fields are flags of their own, as its own fields are)."""
    head, _, rest = name.partition(".")
    return nested_flag(kinds(cls)[head].base, rest) if rest else flag_of(fields_of(cls)[head])


def not_empty(text: str) -> str:
    """The type of a free-text flag (a path): an empty word would otherwise become the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {text!r}")
    return text


def file_stem(text: str) -> str:
    """The type of a ``--name`` flag: the stem of the files written in the output directory, not a path."""
    from transformer_vq.config.fields import file_stem_problem

    if file_stem_problem(text):
        raise argparse.ArgumentTypeError(f"{file_stem_problem(text)}, got {text!r}")
    return text


def int_at_least(minimum: int, why: str = ""):
    """The type of an integer flag outside the config classes, at least ``minimum`` (``why``: the reason, said in the
    refusal), worded as the config fields' checks are."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{bounds_text({'min': minimum}, True)}{f' ({why})' if why else ''}, "
                                             f"got {text!r}")
        return value

    convert.__name__ = f"int_at_least_{minimum}"
    return convert


def float_in(low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False,
             why: str = ""):
    """The type of a number flag outside the config classes, between ``low`` and ``high`` (None: no bound on that
    side; ``low_open``/``high_open``: the bound itself excluded; ``why``: the reason, said in the refusal), worded as
    the config fields' checks are: ``must be > 0``, ``must be in (0, 1]``, ``must be a number, got 'x'``. Like a float
    field, it refuses nan and the infinities (``must be a finite number``). The bounds are kept as ``convert.bounds``
    (the config fields' rule names: min, max, min_open, max_open)."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"float_in: low {low} is above high {high}")
    rules = {"min": low, "max": high, "min_open": low_open, "max_open": high_open}

    def convert(text: str) -> float:
        try:
            value = parse_scalar(text, float, {})
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if outside_bounds(value, rules):
            raise argparse.ArgumentTypeError(f"{bounds_text(rules, False)}{f' ({why})' if why else ''}, got {text!r}")
        return value

    convert.__name__ = "float_in"
    convert.bounds = dict(rules)
    return convert


def add_preset_flag(parser, default: str, presets: dict | None = None, source: str | None = None) -> None:
    """``--preset NAME``: the model to start from, checked against ``presets`` (default: the Transformer-VQ
    presets) while parsing; ``source`` says in the help where the presets come from."""
    from transformer_vq.config.model import PRESETS

    names = PRESETS if presets is None else presets
    if source is None:
        source = "App. C of the paper for enwik8, pg19, imagenet64" if names is PRESETS else "LongVQ: docs/longvq.md"

    def preset_name(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(names)}, got {text!r}")
        return text

    parser.add_argument("--preset", type=preset_name, metavar="{" + ",".join(names) + "}",
                        help=f"model preset (default: {default}; {source})")


def output_dir(path: str | Path, flag: str = "--out") -> Path:
    """``path`` made as the directory of a report, or of any command's output (``flag``: the flag that named it, said
    in a refusal); :class:`~transformer_vq.config.ConfigError` when it cannot hold files: every command checks it
    before its work (a benchmark before its first cell), so that the work is not lost."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag}: {path} is a file, not a directory; remove it or choose another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag}: cannot make the directory {path} ({err.strerror}); choose another path") from None
    try:  # a file made and dropped at once: os.access says yes to root, and to /proc, where nothing can be written
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(f"{flag}: cannot write in {path} ({err.strerror}); choose another path") from None
    return path
