"""``tvq bench op|train|decode --device cuda``: every operator method runs on the GPU in its own process, eager and
compiled, and the result records the GPU, its matmul rate and each cell's GPU memory; the training and decoding
benchmarks run their models on the GPU.

Run with ``python -m pytest -m gpu tests/gpu`` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import json

import pytest

from transformer_vq.cli import main

pytestmark = pytest.mark.gpu

TINY = ["--d-k", "16", "--d-v", "32", "--n-code", "16", "--block-len", "16", "--flash-chunk-len", "16", "--lengths",
        "32", "64", "--repeats", "1", "--paired", "64"]
METHODS = ["vq-serial", "vq-matmul", "vq-assoc", "vq-triton", "vq-qk", "sdpa", "full", "flash"]


# Every method in its own process, and every method compiled, take minutes on a GPU machine (a fresh process per
# cell imports torch and starts CUDA; inductor compiles each method): slow, so that the GPU checks of a lent
# machine's short lease (benchmarks/gpu_session.sh verify) run the in-process eager case and the full set runs with
# `pytest -m gpu`.
@pytest.mark.parametrize("extra", [
    ["--no-isolate"],
    pytest.param([], marks=pytest.mark.slow, id="eager-isolated"),
    pytest.param(["--torch-compile", "--no-isolate"], marks=pytest.mark.slow, id="compiled"),
], ids=["eager-in-process", "eager-isolated", "compiled"])
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
    twins = {m + "+compile" for m in METHODS} if "--torch-compile" in extra else set()
    assert {p["method"] for p in result["paired"]} == set(METHODS) | twins


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_bench_train_and_decode_on_cuda(tmp_path, capsys, precision):
    sizes = ["--d-model", "32", "--d-k", "16", "--d-v", "32", "--n-code", "16", "--block-len", "16"]
    train = ["bench", "train", "--device", "cuda", "--precision", precision, "--models", "vq/shga", "full/shga",
             "--lengths", "64", "128", "--repeats", "1", *sizes, "--no-isolate", "--out", str(tmp_path),
             "--name", "train"]  # in process: a fresh process per cell costs seconds of a lent GPU's lease each
    decode = ["bench", "decode", "--device", "cuda", "--precision", precision, "--contexts", "64", "256",
              "--new-tokens", "2", *sizes, "--no-isolate", "--out", str(tmp_path), "--name", "decode"]
    assert main(train) == 0 and main(decode) == 0
    capsys.readouterr()
    trained = json.loads((tmp_path / "train.json").read_text())
    assert trained["config"]["device"] == "cuda" and {r["status"] for r in trained["rows"]} == {"ok"}
    decoded = json.loads((tmp_path / "decode.json").read_text())
    assert decoded["config"]["device"] == "cuda"
    assert all(r["status"] == "ok" and r["per_token_s"] > 0 for r in decoded["rows"]), decoded["rows"]
