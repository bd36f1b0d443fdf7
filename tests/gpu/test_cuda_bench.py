"""``tvq bench op --device cuda``: every method runs on the GPU in its own process, eager and compiled, and the result
records the GPU, its matmul rate and each cell's GPU memory.

Run with ``python -m pytest -m gpu tests/gpu`` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import json

import pytest

from transformer_vq.cli import main

pytestmark = pytest.mark.gpu

TINY = ["--d-k", "8", "--d-v", "16", "--n-code", "8", "--block-len", "16", "--flash-chunk-len", "16", "--lengths",
        "32", "64", "--repeats", "1", "--paired", "64"]
METHODS = ["vq-serial", "vq-matmul", "vq-assoc", "vq-triton", "vq-qk", "sdpa", "full", "flash"]


@pytest.mark.parametrize("extra", [[], ["--torch-compile", "--no-isolate"]], ids=["eager-isolated", "compiled"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_bench_op_on_cuda(tmp_path, capsys, precision, extra):
    argv = ["bench", "op", "--device", "cuda", "--precision", precision, "--methods", *METHODS, *TINY, *extra,
            "--out", str(tmp_path), "--name", "op"]
    assert main(argv) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "op.json").read_text())
    assert result["config"]["device"] == "cuda" and result["machine"]["gpus"]
    for row in result["rows"]:
        assert row["status"] == "ok", row
        # the yardstick ran on the GPU: any GPU multiplies faster than 1 TFLOP/s, no CPU core does
        assert row["matmul_gflops"] > 1000, row
        assert row["cuda_peak_bytes"] > 0 and row["forward_s"] > 0 and row["fwd_bwd_s"] > 0
    twins = {m + "+compile" for m in METHODS} if extra else set()
    assert {p["method"] for p in result["paired"]} == set(METHODS) | twins
