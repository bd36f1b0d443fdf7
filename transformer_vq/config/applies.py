"""Where an option applies: the one declaration every command reads to refuse an option that would change nothing.

An option (a config field) declares the settings it applies under in its metadata, ``option(..., applies={...})``:
a mapping of another field's name to the values it must have, all of them together. ``mask_rate`` applies only to
encoders: ``applies={"causal": (False,)}``; ``flash_chunk_len`` only to the 'flash' baseline:
``applies={"attn_type": ("flash",)}``. The names are looked up in the run's *context*, one flat mapping of every
field of the command's configs (model, training, and a job's own fields beside the run it reads; their names never
collide) plus ``arch``. Where an option applies to some architectures only, the registry of architectures says so
(:attr:`transformer_vq.config.arch.Arch.refused_options`); this module holds the conditions on fields.

Two checks read the declaration:

* :func:`given_problems`: an option the user gives (a flag, ``--set``, a config file, a keyword) where it does not
  apply is refused, whatever its value but the one that turns it off, when it has one (``option(..., off=0)``:
  ``--sample-tokens 0`` asks an encoder for nothing); the command line and the config builders call it on what was
  given.
* :func:`switch_problems`: on a config however it was built (Python included), a *switch* (a boolean, a choice, or a
  number whose default 0 or none means off) set away from its default, and from the value that turns it off, where
  it does not apply is refused. Sizes and rates that presets set (``n_code``, ``mask_rate``) are left to the first
  check: a preset's value is not the user's.

Torch-free, like every config module.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from transformer_vq.config.fields import fields_of, is_real, kinds


class Above:
    """A condition on a number: above ``bound`` (``applies={"sample_tokens": Above(0)}``)."""

    def __init__(self, bound):
        self.bound = bound

    def __contains__(self, value) -> bool:
        return is_real(value) and value > self.bound

    def __str__(self) -> str:
        return f"above {self.bound}"


class Other:
    """A condition on a value: any but ``values`` (``applies={"data": Other("imagenet64")}``)."""

    def __init__(self, *values):
        self.values = values

    def __contains__(self, value) -> bool:
        return value not in self.values

    def __str__(self) -> str:
        return "other than " + " or ".join(map(word, self.values))


def word(value) -> str:
    """A value as a config file spells it: ``true``, ``'vq'``, ``0``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _allowed_text(allowed) -> str:
    return " or ".join(map(word, allowed)) if isinstance(allowed, tuple) else str(allowed)


def conditions(field: dataclasses.Field) -> Mapping[str, object]:
    """The field's ``applies`` declaration (empty: it applies everywhere its command runs)."""
    return field.metadata.get("applies", {})


def where_text(field: dataclasses.Field) -> str:
    """Where ``field`` applies, in words: "attn_type 'vq' and causal true"."""
    return " and ".join(f"{name} {_allowed_text(allowed)}" for name, allowed in conditions(field).items())


def unmet(field: dataclasses.Field, context: Mapping[str, object]) -> list[str]:
    """The conditions of ``field`` the context does not meet, each as the context has it ("causal true")."""
    return [f"{name} {word(context[name])}" for name, allowed in conditions(field).items()
            if name in context and context[name] not in allowed]


def problem_text(field: dataclasses.Field, value, missed: list[str], fixed: Mapping[str, str] | None = None) -> str:
    """A refusal: where the option applies, what this run has, the value, and what to do. ``fixed``: the fields the
    run cannot change, each with why (a LongVQ language model's ``causal``); setting them is not offered."""
    names = [n.split()[0] for n in missed]
    settable = [n for n in names if n not in (fixed or {})]
    why = "; ".join(fixed[n] for n in names if n not in settable)
    remedy = f", or set {' and '.join(settable)} as it needs" if settable else ""
    return (f"applies only with {where_text(field)} (this run has {' and '.join(missed)}), got {value!r}; leave it "
            f"out{remedy}" + (f" ({why})" if why else ""))


def given_problems(cls, given: Iterable[str], context: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(field, text)`` for each field of ``cls`` named in ``given`` whose conditions ``context`` does not meet."""
    known = fields_of(cls)
    found = []
    for name in sorted(set(given) & set(known)):
        missed = unmet(known[name], context)
        if missed and not turns_off(known[name], context.get(name)):
            found.append((name, problem_text(known[name], context.get(name), missed)))
    return found


def turns_off(field: dataclasses.Field, value) -> bool:
    """Whether ``value`` is the one that turns ``field`` off (``option(..., off=0)``): it asks for nothing, so it
    is accepted wherever the option does not apply."""
    return "off" in field.metadata and value == field.metadata["off"] and not isinstance(value, bool)


def is_switch(cls, field: dataclasses.Field) -> bool:
    """Whether ``field`` is a switch: a boolean, a choice, or a number whose default 0 or none means off."""
    kind = kinds(cls)[field.name]
    number_off = kind.base in (int, float) and field.default in (0, None)
    return kind.base is bool or "choices" in field.metadata or number_off


def switch_problems(obj, context: Mapping[str, object] | None = None, *, switches_only: bool = True,
                    fixed: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(field, text)`` for each switch of config ``obj`` set away from its default where it does not apply
    (``context``: default, the config's own fields); ``switches_only`` False: each field set away from its default
    (a job's config, which no preset fills: every value other than the default is the user's); ``fixed`` as
    :func:`problem_text`'s."""
    context = dataclasses.asdict(obj) if context is None else context
    found = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if conditions(field) and (is_switch(type(obj), field) or not switches_only) and value != default \
                and not turns_off(field, value):
            missed = unmet(field, context)
            if missed:
                found.append((field.name, problem_text(field, value, missed, fixed)))
    return found
