"""The library stays readable in one sitting: no file over 400 lines, no function over 60, no line over 120 characters.

These are the limits the package was shaped to (one concept per file, short pure functions); a change that
breaks them should split along a natural seam rather than raise a limit. The line limit also holds for the tests
and benchmarks (every tracked or untracked ``.py`` file under those folders), so that any file reads, and diffs
side by side, without wrapping.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_vq"
LINE_CHECKED = ("transformer_vq", "tests", "benchmarks")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_LINE_CHARS = 120


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _line_checked_sources() -> list[Path]:
    """Every tracked or untracked (not ignored) ``.py`` file under :data:`LINE_CHECKED`; outside a git checkout,
    every ``.py`` file there."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--",
                                 *LINE_CHECKED], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for folder in LINE_CHECKED for p in (ROOT / folder).rglob("*.py"))
    paths = {ROOT / name for name in listed.decode().split("\0") if name.endswith(".py")}
    return sorted(p for p in paths if p.is_file())


def test_the_package_is_found():
    assert len(_sources()) > 50
    assert len(_line_checked_sources()) > len(_sources())


def test_no_file_over_the_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_over_the_limit():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = length
    assert long == {}


def test_no_line_over_the_limit():
    long = [f"{path.relative_to(ROOT)}:{number} ({len(line)})" for path in _line_checked_sources()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_LINE_CHARS]
    assert not long, f"{len(long)} line(s) over {MAX_LINE_CHARS} characters:\n" + "\n".join(long)
