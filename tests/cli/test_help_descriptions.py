"""Every command's ``--help`` opens with a description of what it does (argparse prints none unless it is given:
``tvq demo`` and ``tvq version`` had only a usage line)."""

from __future__ import annotations

import argparse

import pytest

from transformer_vq.cli import build_parser


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """``(words, parser)`` of every command and subcommand under ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from commands(sub, (*prefix, name))


def test_every_command_has_a_description():
    found = dict(commands(build_parser()))
    assert {("train",), ("demo",), ("version",)} <= set(found)
    missing = [" ".join(words) for words, parser in found.items() if not (parser.description or "").strip()]
    assert not missing, f"commands whose --help says nothing of what they do: {missing}"


def test_demo_help_says_what_the_demo_does(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    out = capsys.readouterr().out
    assert "a one-minute tour of the library on random weights" in out
    assert "linear-time and quadratic paths give the same logits" in " ".join(out.split())
