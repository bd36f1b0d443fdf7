"""``tvq bench op --device`` and ``--compile``: a CUDA request without a GPU is refused before anything runs, and the
compiled methods run and report every figure (slow: compilation takes minutes on a 2-core CPU). The CUDA run itself is
in tests/gpu/test_cuda_bench.py."""

from __future__ import annotations

import statistics

import pytest
import torch

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.op import run_op_bench
from transformer_vq.cli import main
from transformer_vq.config import PRESETS

TINY = dict(lengths=(32,), model=PRESETS["enwik8"].replace(d_k=8, d_v=16, n_code=8, block_len=16, flash_chunk_len=16),
            repeats=1, isolate=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("bench", ["op", "train", "decode"])
def test_cuda_without_a_gpu_is_refused_before_writing_anything(tmp_path, capsys, bench):
    assert main(["bench", bench, "--device", "cuda", "--no-isolate", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("error: --device: cuda was requested but no CUDA GPU is available; "
                                               "use --device cpu (or auto)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_compiled_methods_report_every_figure():
    result = run_op_bench(OpBenchConfig(methods=("vq-serial", "sdpa"), torch_compile=True, paired=(32,), **TINY),
                          log=lambda line: None)
    assert result["config"]["torch_compile"] is True
    for row in result["rows"]:
        assert row["status"] == "ok", row
        assert row["forward_s"] > 0 and row["fwd_bwd_s"] > 0 and row["forward_gflops"] > 0
    paired = {p["method"]: p for p in result["paired"]}
    # every method eager and compiled, interleaved; the compiled twin's gain is measured against its eager self
    assert set(paired) == {"vq-serial", "sdpa", "vq-serial+compile", "sdpa+compile"}
    twin, eager = paired["vq-serial+compile"], paired["vq-serial"]
    assert twin["compile_speedup"] == statistics.median(e / c for e, c in zip(eager["samples"], twin["samples"]))
    assert "compile_speedup" not in eager and twin["speedup"]["sdpa"] > 0 and 0 < twin["fraction_of_peak"]
