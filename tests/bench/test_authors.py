"""The comparisons with the authors' JAX layer (benchmarks/authors_crosscheck.py, benchmarks/jax_layer.py). Their runs
are slow, and only where the authors' code and a JAX environment are named: TVQ_AUTHORS (their git directory or
source) and TVQ_JAX_PYTHON."""

from __future__ import annotations

import argparse
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


def _jax_layer():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import jax_layer
    finally:
        sys.path.remove(str(BENCHMARKS))
    return jax_layer


def test_jax_layer_lengths_and_growth():
    jax_layer = _jax_layer()
    assert [jax_layer.layer_length(w) for w in ("2k", "8k", "1536")] == [2048, 8192, 1536]
    for bad in ("1k", "2500"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"multiple of 512, at least 1536 .* got '{bad}'"):
            jax_layer.layer_length(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer, got 'lots'"):
        jax_layer.layer_length("lots")
    rows = [{"T": t, "mode": m, "ours_s": t * f, "authors_s": 2 * t * f} for t in (8192, 32768)
            for m, f in (("fwd", 1.0), ("fwdbwd", 3.0))]
    rows[3]["ours_s"] *= 5  # 32k fwdbwd: ours five times the linear growth
    assert jax_layer.growth(rows, 8192, 32768) == {"fwd": {"ours": 4.0, "authors": 4.0},
                                                  "fwdbwd": {"ours": 20.0, "authors": 4.0}}


@pytest.mark.slow
def test_jax_layer_runs_both_workers_at_the_smallest_length(tmp_path):
    if not os.environ.get("TVQ_JAX_PYTHON") or not os.environ.get("TVQ_AUTHORS"):
        pytest.skip("set TVQ_JAX_PYTHON (a python with jax 0.4.13, flax 0.6.11) and TVQ_AUTHORS (the authors' code)")
    result = _jax_layer().main(["--lengths", "1536", "--repeats", "1", "--out", str(tmp_path), "--name", "smoke"])
    assert [(r["T"], r["mode"]) for r in result["rows"]] == [(1536, "fwd"), (1536, "fwdbwd")]
    assert all(r["ours_s"] > 0 and r["authors_s"] > 0 and len(r["ours_samples"]) == 1 for r in result["rows"])
    # each side's process reports its own peak RSS (the JAX side too: its worker loads the memory reader by path)
    assert all(r["ours_peak_rss_bytes"] > 2**20 and r["authors_peak_rss_bytes"] > 2**20 for r in result["rows"])
    # the products counted on our side (fwd: the projections, the quantizer's distances, the attention's products;
    # fwd+bwd about three times that), set against the matmul rate measured in every round
    fwd, fwdbwd = result["rows"]
    assert 40e9 > fwd["flops"] > 10e9 and 2.5 < fwdbwd["flops"] / fwd["flops"] < 3.5
    assert fwd["matmul_flops_per_s"] > 0 and len(fwd["matmul_samples"]) == 1  # one per round
    assert fwd["twice_authors_needs"] == 2 * fwd["authors_of_matmul"]
    assert result["authors_versions"]["jax"] == "0.4.13"
    assert "| 1536 | fwd |" in (tmp_path / "smoke.md").read_text()
