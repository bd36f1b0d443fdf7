"""Every ``transformer_vq.…`` name the README and docs/ write in backticks exists: a renamed or imagined function in
the docs (``word_level_perplexity``, found by a new-user audit) sends a reader to an ImportError."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REFERENCE = re.compile(r"`[^`\n]*?\b(transformer_vq(?:\.[A-Za-z_]\w*)+)")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or an attribute reachable from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_name_the_docs_give_exists(doc):
    names = sorted({m.group(1).rstrip(".") for m in REFERENCE.finditer(doc.read_text())})
    missing = [name for name in names if not resolves(name)]
    assert not missing, f"{doc.name} names what does not exist: {missing}"
