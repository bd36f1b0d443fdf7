"""Every Python block of the README and docs/ names only what it defines, imports, or declares as given: a block
that used a name it never defined (``prompt_ids`` in the README's Hugging Face example, found by a new user's audit)
ends in a NameError for whoever copies it. A fragment that stands for the reader's own tensors says so on a line
``# given: a, b (what they are), c``; a later block of the same page may use what an earlier one defined."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
GIVEN = re.compile(r"^\s*# given: (.*)$", re.M)


def given_names(source: str) -> set[str]:
    """The names a block's ``# given:`` lines declare (parenthesized words are their description)."""
    names = set()
    for line in GIVEN.findall(source):
        names.update(re.findall(r"\b[A-Za-z_]\w*\b", re.sub(r"\([^)]*\)", "", line)))
    return names


def bound_and_used(tree: ast.AST) -> tuple[set[str], list[tuple[str, int]]]:
    """Names a block binds (assignments, imports, definitions and their parameters, ``for``/``with``/``except``
    targets) and the names it reads, with their lines."""
    bound, used = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                used.append((node.id, node.lineno))
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, used


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_defines_what_it_uses(page):
    known, problems = set(dir(builtins)), []
    for index, match in enumerate(BLOCK.finditer(page.read_text())):
        source = match.group(1)
        line = page.read_text()[:match.start()].count("\n") + 2  # the block's first line in the page
        try:
            tree = ast.parse(source)
        except SyntaxError as err:
            problems.append(f"block {index} (line {line}): not Python: {err.msg}")
            continue
        bound, used = bound_and_used(tree)
        known |= bound | given_names(source)
        problems += [f"block {index}, line {line + at - 1}: {name!r} is used but never defined, imported or given"
                     for name, at in used if name not in known]
    assert not problems, f"{page.name}:\n" + "\n".join(problems)
