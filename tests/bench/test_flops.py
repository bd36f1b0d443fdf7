"""FLOP counting for the benchmarks' matmul-rate columns (benchmarks/flops.py) and the workers' ``flops`` request
(benchmarks/worker_protocol.py)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import worker_protocol  # noqa: E402
from flops import count_flops  # noqa: E402


def test_products_are_counted_the_in_place_baddbmm_too():
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    x, y, total = torch.randn(3, 4, 6), torch.randn(3, 6, 5), torch.zeros(3, 4, 5)
    assert count_flops(lambda: a @ b) == 2 * 4 * 6 * 5
    assert count_flops(lambda: total.baddbmm_(x, y)) == 2 * 3 * 4 * 6 * 5  # not counted by torch's own table
    assert count_flops(lambda: (x @ y, total.baddbmm_(x, y), torch.exp(total))) == 2 * 2 * 3 * 4 * 6 * 5


def _serve(requests, count):
    """The replies of a worker holding one mode whose call does nothing, to ``requests``."""
    stdin, stdout = sys.stdin, sys.stdout
    sys.stdin, out = io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), io.StringIO()
    sys.stdout = out
    try:
        worker_protocol.serve(lambda T: {"fwd": lambda: None}, {"side": "test"}, count=count)
    finally:
        sys.stdin, sys.stdout = stdin, stdout
    return [json.loads(line) for line in out.getvalue().splitlines()][1:]  # after the hello


def test_a_worker_answers_flops_per_mode_or_says_it_does_not_count():
    asked = [{"cmd": "prepare", "T": 8}, {"cmd": "flops", "T": 8}]
    assert _serve(asked, count=lambda fn: 42)[1] == {"flops": {"fwd": 42}}
    assert "does not count" in _serve(asked, count=None)[1]["error"]
