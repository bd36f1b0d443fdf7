"""benchmarks/context_parallel.py runs end to end at a tiny size, in both modes (a smoke test, not a timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["timing", "bytes"])
def test_the_benchmark_runs_end_to_end_at_a_tiny_size(mode, tmp_path):
    """``pytest -m slow``: 2 gloo processes (and 1 for the timing), a minute or more on a shared CPU."""
    out = tmp_path / "cp.json"
    flags = ["--bytes"] if mode == "bytes" else ["--layers", "1", "--steps", "1"]
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "context_parallel.py"), *flags, "--preset", "tiny",
                          "--lengths", "32", "--out", str(out)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    assert "others' load:" in run.stdout
    rows = json.loads(out.read_text())["rows"]
    if mode == "bytes":
        assert len(rows) == 1 and rows[0]["cp_forward_bytes"] > 0 and rows[0]["samples"] >= 1
    else:
        assert [(row["processes"], row["rank"]) for row in rows] == [(1, 0), (2, 0), (2, 1)]
        assert all(row["step_s"] > 0 and row["peak_rss_mib"] > 0 for row in rows)
