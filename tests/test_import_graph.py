"""No import circles among the package's modules: module-level and function-local imports alike (a function-local
import hides a circle from Python, not from a reader).

Circles are strongly connected groups of modules in the graph "module A imports module B". A package's __init__ is
left out as a target of its own submodules' imports only where Python resolves ``from package import name`` to the
submodule; otherwise an import of ``a.b.c`` counts as an import of ``a.b.c`` (the module it names).

The same graph pins the layers the package is built in (``LAYER_RULES``): the operators import no module, model or
training code; the shared layers (``nn``) import no model; the models import no training, command-line or
``transformers`` code, and Transformer-VQ no other family; the checkpointer never imports the parallelism, the engine
never imports a task, the tasks never import each other, and configuration imports nothing above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_vq"
NAME = PACKAGE.name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules and name != me}
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported(path, set(paths)) for name, path in paths.items()}


def circles() -> set[frozenset[str]]:
    edges = graph()
    # Tarjan's strongly connected components
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v), on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert circles() == set()


TRAIN = f"{NAME}.train"
# what sits above the models: the engine and its tasks, the command line, the transformers wrapper, the tools
ABOVE_MODELS = tuple(f"{NAME}.{p}" for p in ("train", "cli", "hf", "bench", "ablate", "export", "__main__"))
TASK_WINGS = (f"{TRAIN}.lm", f"{TRAIN}.classify")
LAYER_RULES = {
    # the math is pure: operators take tensors, never modules, models or the engine
    "ops-above": (lambda m: m.startswith(f"{NAME}.ops"),
                  lambda m: m.startswith((f"{NAME}.nn", f"{NAME}.models", *ABOVE_MODELS))),
    # shared layers serve every family, so none of them is built on one
    "nn-models": (lambda m: m.startswith(f"{NAME}.nn"), lambda m: m.startswith((f"{NAME}.models", *ABOVE_MODELS))),
    "models-above": (lambda m: m.startswith(f"{NAME}.models"), lambda m: m.startswith(ABOVE_MODELS)),
    # the other families are built on Transformer-VQ (its output types, its encoder), never the reverse
    "tvq-families": (lambda m: m.startswith(f"{NAME}.models.tvq"),
                     lambda m: m.startswith(f"{NAME}.models.") and not m.startswith(f"{NAME}.models.tvq")),
    # the checkpointer is a leaf of the engine: what it needs of the workers, the trainer passes in
    "checkpoint-parallel": (lambda m: m.startswith(f"{TRAIN}.checkpoint"), lambda m: m.startswith(f"{TRAIN}.parallel")),
    # the engine is task-free: the wings subclass it, never the other way
    "engine-tasks": (lambda m: m.startswith(f"{TRAIN}.") and not m.startswith(TASK_WINGS),
                     lambda m: m.startswith(TASK_WINGS)),
    "lm-classify": (lambda m: m.startswith(TASK_WINGS[0]), lambda m: m.startswith(TASK_WINGS[1])),
    "classify-lm": (lambda m: m.startswith(TASK_WINGS[1]), lambda m: m.startswith(TASK_WINGS[0])),
    # configuration is the bottom layer (torch-free; the registry names its model classes by import path)
    "config-above": (lambda m: m.startswith(f"{NAME}.config"), lambda m: not m.startswith(f"{NAME}.config")),
}


@pytest.mark.parametrize("rule", LAYER_RULES)
def test_no_import_from_a_lower_layer_to_a_higher_one(rule):
    lower, higher = LAYER_RULES[rule]
    assert sorted(f"{m} -> {t}" for m, targets in graph().items() if lower(m) for t in targets if higher(t)) == []


def test_the_graph_sees_function_local_imports(tmp_path):
    """The check can fail: two modules importing each other inside functions form a circle."""
    global PACKAGE
    pkg = tmp_path / NAME
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from transformer_vq.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from . import a\n")
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert circles() == {frozenset({"transformer_vq.a", "transformer_vq.b"})}
    finally:
        PACKAGE = saved
