"""Our layer equals the authors' JAX layer in float64 (benchmarks/authors_crosscheck.py). Slow, and only where the
authors' code and a JAX environment are named: TVQ_AUTHORS (their git directory or source) and TVQ_JAX_PYTHON."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_layer_equals_the_authors_layer_in_float64(tmp_path):
    if not os.environ.get("TVQ_JAX_PYTHON") or not os.environ.get("TVQ_AUTHORS"):
        pytest.skip("set TVQ_JAX_PYTHON (a python with jax 0.4.13, flax 0.6.11) and TVQ_AUTHORS (the authors' code)")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from authors_crosscheck import main
    finally:
        sys.path.remove(str(BENCHMARKS))
    result = main(["--case", "small", "odd-split", "--out", str(tmp_path / "check")])
    for row in result["rows"]:
        assert row["whole_vs_authors_whole"]["max_abs"] < 1e-12
        assert row["carried_vs_authors_blocks"]["max_abs"] < 1e-12
        assert row["window_span_vs_authors_whole"]["max_abs"] > 1e-3  # the span is what tells them apart
    assert (tmp_path / "check.md").read_text().count("**met**") == 1
