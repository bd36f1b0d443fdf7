"""The scripts under benchmarks/ (not a package) loaded as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def benchmark_script(name: str):
    """``benchmarks/NAME.py`` as a module, its folder on the import path as when the script runs (the scripts import
    their neighbours: result_files, worker_protocol, ...)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
