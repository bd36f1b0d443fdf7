"""Every benchmark script refuses an out-of-range number flag while parsing: ``--repeats 0``, ``--steps -1`` or
``--seed -3`` exit with status 2 and one ``error:`` line naming the flag, before any work starts (not a traceback
from deep inside the run, nor a table of nonsense). Likewise an empty word for a flag of free text (a path, a name):
``--out ""`` would otherwise become the current directory, or fail late; and a length that is no length
(``--lengths 8q``). ``tvq bench --out ""`` is refused the same way.

The scripts are found by globbing benchmarks/ (a new script is covered); their flags by capturing the parser each
script's ``main`` builds. Each refusal is checked in-process: ``main`` is called with the bad value while
``ArgumentParser.parse_known_args`` is patched to stop the script right after parsing, so a value that is wrongly
accepted fails the test instead of starting a benchmark. A script without ``main`` is run as ``__main__`` the same
way. Two scripts that import no torch are also run as real processes, to check the exit status end to end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py")) + sorted(BENCH.glob("jax_side/*.py"))


def script_id(path: Path) -> str:
    return str(path.relative_to(BENCH))


def has_parser(path: Path) -> bool:
    return bool(re.search(r"\b(ArgumentParser|Parser)\(", path.read_text()))


class Parsed(Exception):
    """Raised in place of returning from ``parse_known_args``: the script stops before its work."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


@contextlib.contextmanager
def stop_at_parsing(before: bool):
    """Every ``parse_known_args`` raises :class:`Parsed`: before parsing (``before``) or after it succeeded."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        if not before:
            original(self, args, namespace)
        raise Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", parse_known_args):
        yield


def load(path: Path):
    """The script as a module, its folder and benchmarks/ on the import path as when it runs; skipped when it imports
    a package that is not installed (jax, flax, ...)."""
    saved = list(sys.path)
    sys.path[:0] = [str(path.parent), str(BENCH)]
    try:
        spec = importlib.util.spec_from_file_location(f"script_flags_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ModuleNotFoundError as err:
        if err.name and (path.parent / f"{err.name.split('.')[0]}.py").exists():
            raise
        pytest.skip(f"{script_id(path)} imports {err.name}, which is not installed here")
    finally:
        sys.path[:] = saved
    return module


def run_script(module, path: Path, argv: list[str]) -> None:
    """The script's ``main`` on ``argv`` (given as its argument, or as ``sys.argv`` when it takes none); the whole
    script as ``__main__`` when it has no ``main``."""
    main = getattr(module, "main", None)
    with mock.patch.object(sys, "argv", [str(path), *argv]):
        if main is None:
            runpy.run_path(str(path), run_name="__main__")
        elif inspect.signature(main).parameters:
            main(argv)
        else:
            main()


def parser_of(module, path: Path) -> argparse.ArgumentParser:
    with stop_at_parsing(before=True), pytest.raises(Parsed) as stop:
        run_script(module, path, [])
    return stop.value.parser


def bounds_of(convert) -> dict | None:
    """The bounds of a flag's type: ``int_at_least(N)`` (named ``int_at_least_N``), or a converter that keeps them as
    ``bounds`` (``float_in``); None for a type that is not a number (a path, a choice)."""
    found = re.fullmatch(r"int_at_least_(-?\d+)", getattr(convert, "__name__", ""))
    if found:
        return {"min": int(found.group(1))}
    return getattr(convert, "bounds", None)


def outside(bounds: dict) -> str:
    """A value just outside ``bounds``: below the minimum, else above the maximum."""
    if bounds.get("min") is not None:
        low = bounds["min"]
        return f"{low if bounds.get('min_open') else low - 1:g}"
    high = bounds["max"]
    return f"{high if bounds.get('max_open') else high + 1:g}"


def number_flags(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, dict | None]]:
    """``(action, bounds)`` of each flag whose type is a number: a plain ``int``/``float`` has no bounds (None)."""
    found = []
    for action in parser._actions:
        if action.type in (int, float):
            found.append((action, None))
        elif (bounds := bounds_of(action.type)) is not None:
            found.append((action, bounds))
    return found


def refusal(module, path: Path, capsys, argv: list[str], flag: str, says: str = "must be") -> str | None:
    """What is wrong with the script's answer to ``ARGV`` (None: refused as it should be: exit status 2 and one
    ``error:`` line, the last, naming ``flag`` and saying ``says``)."""
    given = shlex.join(argv)
    with stop_at_parsing(before=False):
        try:
            run_script(module, path, argv)
        except Parsed:
            return f"{given} was accepted"
        except SystemExit as stop:
            code = stop.code
        else:
            return f"{given}: main returned without parsing"
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if "error:" in line]
    if code != 2:
        return f"{given}: exit status {code!r}, not 2"
    if len(errors) != 1 or errors[0] != err[-1] or flag not in errors[0] or says not in errors[0]:
        return f"{given}: not one error line naming the flag: {err}"
    return None


PARSED_SCRIPTS = [p for p in SCRIPTS if has_parser(p)]


def test_every_script_with_a_parser_is_checked():
    assert len(PARSED_SCRIPTS) >= 20
    assert {"pathfinder_fit.py", "codebook_sweep.py", "jax_side/worker.py"} <= set(map(script_id, PARSED_SCRIPTS))


@pytest.mark.parametrize("path", PARSED_SCRIPTS, ids=script_id)
def test_number_flags_are_bounded_and_refused_while_parsing(path, capsys):
    module = load(path)
    flags = number_flags(parser_of(module, path))
    unbounded = [action.option_strings for action, bounds in flags if bounds is None]
    assert unbounded == [], f"{script_id(path)}: use transformer_vq.config.flags.int_at_least or float_in"
    problems = []
    for action, bounds in flags:
        flag = action.option_strings[-1]
        convert = action.type
        defaults = action.default if isinstance(action.default, (list, tuple)) else [action.default]
        for default in (d for d in defaults if d is not None and d is not argparse.SUPPRESS):
            if convert(str(default)) != default:  # the default stays a valid value: valid runs are unchanged
                problems.append(f"{flag}: default {default!r} is not what its type makes of it")
        for bad in (outside(bounds), "nan", "x"):
            problems.append(refusal(module, path, capsys, [f"{flag}={bad}"], flag))
    assert [p for p in problems if p] == []


STORING = (argparse._StoreAction, argparse._AppendAction, argparse._ExtendAction)


def text_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Each flag (or positional) that stores the words it is given, neither a number nor a choice: a path, a name,
    a preset, a length."""
    numbers = {id(action) for action, _ in number_flags(parser)}
    return [a for a in parser._actions if isinstance(a, STORING) and not a.choices and id(a) not in numbers]


def name_of(action: argparse.Action) -> str:
    """What argparse's error line calls ``action``: its last option string, or a positional's name."""
    return action.option_strings[-1] if action.option_strings else action.metavar or action.dest


def given_as(action: argparse.Action, value: str) -> list[str]:
    """The command line giving ``value`` to ``action`` (as many times as the flag takes words)."""
    return [*action.option_strings[-1:], *[value] * (action.nargs if isinstance(action.nargs, int) else 1)]


@pytest.mark.parametrize("path", PARSED_SCRIPTS, ids=script_id)
def test_text_flags_have_a_converter_and_refuse_an_empty_word_while_parsing(path, capsys):
    module = load(path)
    flags = text_flags(parser_of(module, path))
    plain = [name_of(action) for action in flags if action.type in (None, str)]
    assert plain == [], f"{script_id(path)}: use transformer_vq.config.flags.not_empty (or a stricter type)"
    problems = [refusal(module, path, capsys, given_as(action, empty), name_of(action), says="error:")
                for action in flags for empty in ("", "   ")]
    # a --name is the stem of the files written in --out: a path would write elsewhere
    problems += [refusal(module, path, capsys, given_as(action, "a/b"), name_of(action), says="not a path")
                 for action in flags if name_of(action) == "--name"]
    assert [p for p in problems if p] == []


def test_every_script_has_text_flags_to_check():
    """The discovery above finds the flags: a free-text flag is in most scripts (a new parser style would hide them)."""
    found = {script_id(p) for p in PARSED_SCRIPTS if text_flags(parser_of(load(p), p))}
    assert {"jax_layer.py", "fsdp_memory.py", "longdoc_recall_text.py", "jax_side/worker.py"} <= found


LENGTHS = [("jax_layer.py", "--lengths", "2k 8k 32k"), ("layer_versions.py", "--lengths", "8k 32k"),
           ("memory_profile.py", "--length", "32k")]


@pytest.mark.parametrize("script, flag, old_default", LENGTHS, ids=[s for s, _, _ in LENGTHS])
def test_a_length_that_is_no_layer_length_is_refused_while_parsing(script, flag, old_default, capsys):
    """``--lengths`` of the whole-layer scripts: one converter (``8k`` = 8192, a multiple of 512, at least three
    blocks of the authors' layer); a bad word exits 2 while parsing, and the defaults are the lengths they were."""
    path = BENCH / script
    module = load(path)
    action = next(a for a in parser_of(module, path)._actions if flag in a.option_strings)
    assert action.type.__name__ == "layer_length"
    default = [action.type(word) for word in old_default.split()]
    assert action.default == (default if action.nargs == "+" else default[0])
    assert [action.type(w) for w in ("1536", "2k", "8K", "32k")] == [1536, 2048, 8192, 32768]
    problems = [refusal(module, path, capsys, [f"{flag}={bad}"], flag, says=says)
                for bad, says in (("8q", "must be an integer, got '8q'"), ("0", "must be a multiple of 512"),
                                  ("1k", "at least 1536"), ("2500", "got '2500'"), ("-2k", "must be"))]
    assert [p for p in problems if p] == []


@pytest.mark.parametrize("bench", ["op", "train", "decode", "longvq"])
@pytest.mark.parametrize("empty", ["", "   "])
def test_tvq_bench_refuses_an_empty_out_while_parsing(bench, empty, capsys):
    from transformer_vq.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["bench", bench, "--out", empty])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert len(err) == 1 and err[0].startswith("error: --out: must not be empty, got '"), err


@pytest.mark.parametrize("script, argv, message", [
    ("fsdp_memory.py", ["--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
    ("jax_side/worker.py", ["--batch", "0"], "argument --batch: must be a positive integer, got '0'"),
    ("fsdp_memory.py", ["--batch", "3"], "argument --batch: must be even (split evenly over the 2 workers), got '3'"),
    ("jax_side/worker.py", ["--src", "", "--params", "p.npz"], "argument --src: must not be empty, got ''"),
])
def test_a_refusal_is_the_process_exit(script, argv, message):
    """End to end, in a process of its own: status 2, usage and one error line, no traceback
    (these two scripts import no torch)."""
    done = subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True, text=True, timeout=30,
                          cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"error: {message}")
    assert "Traceback" not in done.stderr


def test_pathfinder_tau_max_is_off_or_a_real_range():
    """``--tau-max`` draws ``tau`` log-uniform over ``[1.5, tau_max]``: 0 (off) or at least 1.5, nothing between."""
    module = load(BENCH / "pathfinder_fit.py")
    assert (module.tau_max("0"), module.tau_max("1.5"), module.tau_max("20")) == (0.0, 1.5, 20.0)
    for text, message in (("1", "must be 0 (off) or >= 1.5"), ("-1", "must be >= 0 (0 = off)"),
                          ("inf", "must be a finite number")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            module.tau_max(text)
    assert module.parse_args([]).tau_max == 0.0
