"""Smoke tests of the benchmarks: each runs at tiny sizes and its result holds every expected figure.

No assertion is about time (benchmarks are not timed tests): only that the figures are there and well-formed, that
cells over budget are reported as skipped, and that the command line writes the table, JSON and plot.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import torch

import transformer_vq.bench.decode as decode
from transformer_vq.bench.config import (LONGVQ_BENCH_PRESETS, DecodeBenchConfig, LongVQBenchConfig, OpBenchConfig,
                                         TrainBenchConfig)
from transformer_vq.bench.decode import run_decode_bench
from transformer_vq.bench.longvq import run_longvq_bench
from transformer_vq.bench.op import forward_flops, run_op_bench
from transformer_vq.bench.op_methods import make_inputs, method_fn, vq_matmuls
from transformer_vq.bench.report import table, write_report
from transformer_vq.bench.train import run_train_bench, scaling
from transformer_vq.cli import main
from transformer_vq.config import PRESETS

TINY_OP = dict(lengths=(32, 64), model=PRESETS["enwik8"].replace(d_k=8, d_v=16, n_code=8, block_len=16,
                                                                  flash_chunk_len=16), repeats=1, isolate=False)
TINY_SIZES = dict(d_model=32, d_k=8, d_v=32, n_code=8, block_len=16, flash_chunk_len=16)
TINY_MODEL = dict(model=PRESETS["tiny"].replace(**TINY_SIZES), isolate=False)


def test_op_bench_figures(tmp_path):
    result = run_op_bench(OpBenchConfig(methods=("vq-serial", "vq-matmul", "sdpa", "full", "flash"), paired=(64,),
                                        **TINY_OP), log=lambda line: None)
    machine = result["machine"]
    for key in ("cpu", "commit", "torch", "numpy", "python", "load_average_start", "date_utc"):
        assert key in machine
    assert machine["matmul_gflops"]["float32"] > 0 and machine["matmul_gflops"]["bfloat16"] > 0
    assert {(r["method"], r["T"]) for r in result["rows"]} == {
        (m, t) for m in ("vq-serial", "vq-matmul", "sdpa", "full", "flash") for t in (32, 64)}
    for row in result["rows"]:
        assert row["status"] == "ok", row
        for key in ("forward_s", "fwd_bwd_s", "forward_gflops", "fwd_bwd_gflops", "forward_fraction_of_peak",
                    "forward_flops", "inputs_bytes", "matmul_gflops", "load_average_1min"):
            assert row[key] > 0, key
    pairs = {(s["method"], s["baseline"], s["T"]) for s in result["speedups"]}
    assert ("vq-serial", "sdpa", 64) in pairs and ("vq-matmul", "full", 32) in pairs
    assert all(s["forward_speedup"] > 0 for s in result["speedups"])
    paired = {p["method"]: p for p in result["paired"]}
    assert set(paired) == {"vq-serial", "vq-matmul", "sdpa", "full", "flash"}
    assert paired["vq-serial"]["speedup"]["sdpa"] > 0 and len(paired["sdpa"]["samples"]) == 1
    # the VQ methods against their own matmuls' rate too; every method with the others' load during its calls
    assert paired["vq-serial"]["fraction_of_vq_matmuls"] > 0 and "fraction_of_vq_matmuls" not in paired["sdpa"]
    assert all(p["others_load"]["samples"] >= 0 for p in paired.values())
    paths = write_report(result, tmp_path, "op")
    assert json.loads(paths["json"].read_text())["rows"] == result["rows"]
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert "| vq-serial | 64 |" in paths["md"].read_text() and "Paired forward times" in paths["md"].read_text()
    # cells that share this process (--no-isolate) reuse each other's heap: no memory is reported ('-')
    assert not [key for row in result["rows"] for key in row if "peak_rss" in key]
    assert not [key for p in result["paired"] for key in p if "peak_rss" in key]
    assert "| fwd peak RSS (rise) |" in paths["md"].read_text() and " GiB (+" not in paths["md"].read_text()


def test_op_bench_quantized_query_and_noncausal_methods():
    """The methods of the VQ-QK comparison: every cell runs forward and backward, and each VQ method's speedup is taken
    against SDPA of its own causality."""
    methods = ("vq-qk", "sdpa", "vq-bidir", "vq-qk-bidir", "sdpa-bidir")
    result = run_op_bench(OpBenchConfig(methods=methods, paired=(64,), **TINY_OP), log=lambda line: None)
    assert all(row["status"] == "ok" and row["fwd_bwd_s"] > 0 for row in result["rows"])
    pairs = {(s["method"], s["baseline"]) for s in result["speedups"]}
    assert pairs == {("vq-qk", "sdpa"), ("vq-bidir", "sdpa-bidir"), ("vq-qk-bidir", "sdpa-bidir")}
    assert set(next(p for p in result["paired"] if p["method"] == "vq-bidir")["speedup"]) == {"sdpa-bidir"}
    assert "| vq-qk-bidir | 64 |" in table(result)


def test_op_bench_skips_cells_over_budget_and_isolates():
    # The second length is estimated from the first; a budget of 1 ns skips it with its estimate.
    cfg = OpBenchConfig(**{**TINY_OP, "isolate": True, "budget_s": 1e-9, "backward": False}, methods=("sdpa",))
    result = run_op_bench(cfg, log=lambda line: None)
    first, second = result["rows"]
    assert first["status"] == "ok" and first["peak_rss_bytes"] > first["forward_peak_rss_rise_bytes"] >= 0
    assert first["peak_rss_source"] == "VmHWM"  # Linux lets a process reset its high-water mark
    assert second["status"] == "skipped" and second["estimated_forward_s"] >= 0
    assert "| sdpa | 64 | skipped (est." in table(result)


@pytest.mark.parametrize("heads", [dict(n_head=1, head_type="shga"), dict(n_head=4, head_type="mqa")])
def test_the_vq_matmul_yardstick_runs_the_operators_products(heads):
    """The fair yardstick of ``--paired`` multiplies what the operator multiplies: the same products, counted by torch's
    FLOP counter (which does not count the in-place ``baddbmm_`` of the window values in either)."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = OpBenchConfig(**{**TINY_OP, "model": TINY_OP["model"].replace(**heads)}, batch_size=2)
    counts = []
    for fn in (vq_matmuls(cfg, 64), method_fn("vq-serial", cfg, make_inputs(cfg, 64))):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            fn()
        counts.append(counter.get_total_flops())
    m = cfg.model
    window_values = 2 * cfg.batch_size * m.n_head * 64 * 2 * m.block_len * m.d_v
    assert counts[0] == counts[1] == forward_flops("vq-serial", cfg, 64) - window_values


def test_flop_formulas():
    cfg = OpBenchConfig()  # the paper's enwik8 GAU: Dk 128, Dv 1536, S 512, L 512
    assert forward_flops("vq-serial", cfg, 8192) == 2 * 8192 * (512 + 1024) * 1664
    assert forward_flops("sdpa", cfg, 8192) == 8192**2 * 1664
    # full attends whole blocks of rows: sum_n L * (n + 1) L, i.e. T^2/2 plus the diagonal blocks.
    assert forward_flops("full", cfg, 1024) == 2 * (512 * 512 + 512 * 1024) * 1664


def test_train_bench_figures():
    cfg = TrainBenchConfig(lengths=(32,), models=("vq/shga", "vq/mha", "full/mqa", "flash/shga", "flash_quad/shga"),
                           model=PRESETS["tiny"].replace(**TINY_SIZES, head_type="mha", n_head=2), repeats=1,
                           isolate=False)
    result = run_train_bench(cfg, log=lambda line: None)
    assert [r["model"] for r in result["rows"]] == list(cfg.models)
    for row in result["rows"]:
        assert row["status"] == "ok", row
        assert row["tokens_per_s"] > 0 and row["step_s"] > 0 and row["parameters"] > 0
        assert not [key for key in row if "peak_rss" in key]  # cells sharing this process: no memory
    assert "| vq/mha |" in table(result)
    assert table(result).count("| vq/mha |") == 2 and "Peak memory of a step" in table(result)


def test_train_bench_interleaved():
    cfg = TrainBenchConfig(lengths=(16, 32), models=("vq/shga", "full/shga"), repeats=2, interleaved=True, budget_s=1e9,
                           **TINY_MODEL)
    rows = run_train_bench(cfg, log=lambda line: None)["rows"]
    assert [(r["model"], r["T"]) for r in rows] == [(m, t) for m in cfg.models for t in cfg.lengths]
    for row in rows:
        assert row["status"] == "ok" and len(row["step_samples"]) == 2 and row["tokens_per_s"] > 0, row
        assert "peak_rss_bytes" not in row  # not isolated: the cells share one heap
        assert row["others_load"]["samples"] >= 0


def test_isolated_train_and_decode_cells_report_their_memory():
    """A cell in a process of its own measures its peak (and the rise above the process after the imports)."""
    isolated = {**TINY_MODEL, "isolate": True}
    train = run_train_bench(TrainBenchConfig(lengths=(16,), models=("vq/shga",), repeats=1, **isolated),
                            log=lambda line: None)["rows"][0]
    decode = run_decode_bench(DecodeBenchConfig(contexts=(16,), models=("vq",), new_tokens=2, prompt_chunk=16,
                                                **isolated), log=lambda line: None)["rows"][0]
    assert train["peak_rss_bytes"] > 0 and train["peak_rss_rise_bytes"] >= 0 and train["peak_rss_source"]
    assert decode["token_peak_rss_bytes"] > 0 and decode["token_peak_rss_rise_bytes"] >= 0
    assert decode["token_rss_first_bytes"] > 0 and decode["token_rss_last_bytes"] > 0


def test_train_bench_scaling_fits_peak_memory_against_length():
    """A peak exactly linear in T gives its slope per 1,024 tokens and no residual; one cell off the line shows up."""
    rows = [{"model": "vq/shga", "T": t, "status": "ok", "peak_rss_bytes": int((0.5 + 0.1 * t / 1024) * 2**30),
             "peak_rss_rise_bytes": 0, "tokens_per_s": speed} for t, speed in ((1024, 1000.0), (4096, 900.0),
                                                                                 (8192, 800.0))]
    fit = scaling(rows + [{"model": "full/shga", "T": 1024, "status": "oom"}], "vq/shga")
    assert fit["gib_per_1k_tokens"] == pytest.approx(0.1) and fit["intercept_gib"] == pytest.approx(0.5)
    assert fit["max_residual_gib"] < 1e-6 and fit["tokens_per_s_max_over_min"] == pytest.approx(1.25)
    assert scaling(rows, "full/shga") is None  # no length measured
    rows[1]["peak_rss_bytes"] += 2**30
    assert scaling(rows, "vq/shga")["max_residual_gib"] > 0.5
    result = {"benchmark": "train", "config": {"precision": "float32", "lengths": [1024, 4096, 8192], "batch_size": 1,
                                               "model": PRESETS["tiny"].to_dict()},
              "models": ["vq/shga"], "rows": rows, "scaling": [scaling(rows, "vq/shga")],
              "machine": {"cpu": "x", "logical_cpus": 2, "torch_threads": 2, "memory_gib": 1, "cpu_flags": [],
                          "load_average_start": [0, 0, 0], "torch": "t", "numpy": "n", "python": "p", "commit": "c",
                          "date_utc": "d"}}
    assert "GiB per 1k tokens" in table(result) and "| 4096 | 900 |" in table(result)


def test_train_and_decode_draw_tokens_of_the_models_vocabulary():
    small_vocab = {**TINY_MODEL, "model": TINY_MODEL["model"].replace(vocab_size=50)}  # below the 256 byte ids
    train = run_train_bench(TrainBenchConfig(lengths=(16,), models=("vq/shga",), repeats=1, **small_vocab),
                            log=lambda line: None)
    decode = run_decode_bench(DecodeBenchConfig(contexts=(16,), models=("vq",), new_tokens=1, prompt_chunk=16,
                                                **small_vocab), log=lambda line: None)
    assert [row["status"] for row in train["rows"] + decode["rows"]] == ["ok", "ok"]


def test_decode_bench_figures():
    cfg = DecodeBenchConfig(contexts=(16, 48), models=("vq", "full"), new_tokens=2, prompt_chunk=32, **TINY_MODEL)
    result = run_decode_bench(cfg, log=lambda line: None)
    rows = {(r["model"], r["context"]): r for r in result["rows"]}
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["per_token_s"] > 0 and row["state_bytes"] > 0 and row["latency_vs_shortest"] > 0
        assert not [key for key in row if "rss" in key]  # not isolated: the cells share one heap
    assert "| peak RSS (rise) per token |" in table(result)
    # The VQ state has a fixed size; the key/value cache holds every position read (context + new tokens).
    assert rows["vq", 16]["state_bytes"] == rows["vq", 48]["state_bytes"]
    assert rows["full", 48]["state_bytes"] * (16 + 2) == rows["full", 16]["state_bytes"] * (48 + 2)


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    code = main(["bench", "decode", "--contexts", "16", "--models", "vq", "--new-tokens", "1", "--d-model", "16",
                 "--d-k", "8", "--d-v", "16", "--n-code", "4", "--block-len", "8", "--no-isolate",
                 "--out", str(tmp_path), "--name", "d"])
    assert code == 0
    assert "| vq | 16 |" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {"d.json", "d.md", "d.png"}


@pytest.mark.parametrize("args, message", [
    (["op", "--methods", "nope"], "error: --methods: must be one of vq-serial, vq-matmul, vq-assoc, vq-triton, "
                                  "vq-qk, sdpa, full, flash, flash_quad, vq-bidir, vq-qk-bidir, sdpa-bidir, "
                                  "got 'nope'"),
    (["op", "--lengths", "0"], "error: --lengths: must be a positive integer, got '0'"),
    (["op", "--lengths", "2k", "-1"], "error: --lengths: must be a positive integer, got '-1'"),
    (["op", "--budget-s", "nan"], "error: --budget-s: must be a finite number, got 'nan'"),
    (["train", "--models", "vq/gqa"], "error: --models: must be attn_type/head_type pairs with attn_type in vq, "
                                      "full, flash_quad, flash and head_type in shga, mqa, mha, got 'vq/gqa'"),
    (["decode", "--dtype", "bfloat16"], "error: unrecognized arguments: --dtype bfloat16; see tvq bench decode --help"),
])
def test_cli_rejects_bad_input_before_writing_anything(tmp_path, capsys, args, message):
    assert exit_code(["bench", *args, "--no-isolate", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []


def exit_code(argv: list[str]) -> int:
    """The exit status of ``tvq ARGV``: flag errors exit while parsing, later errors are returned."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("text,value", [("8k", 8192), ("128k", 131072), ("100", 100)])
def test_length_suffix(text, value):
    from transformer_vq.config.fields import parse_scalar

    assert parse_scalar(text, int, {"k_suffix": True}) == value


def test_cli_nests_the_model_config():
    from transformer_vq.cli import build_parser
    from transformer_vq.cli.bench import bench_config

    cfg = bench_config(build_parser().parse_args(["bench", "op", "--block-len", "64", "--batch-size", "2",
                                                  "--precision", "bfloat16", "--lengths", "1k", "2k"]))
    assert (cfg.model.block_len, cfg.model.d_k, cfg.model.d_v, cfg.model.n_code) == (64, 128, 1536, 512)
    assert (cfg.batch_size, cfg.precision, cfg.lengths) == (2, "bfloat16", (1024, 2048))
    cfg = bench_config(build_parser().parse_args(["bench", "decode", "--preset", "tiny", "--n-layers", "2"]))
    assert cfg.model == PRESETS["tiny"].replace(n_layers=2)
    assert DecodeBenchConfig().model.to_dict() == {**PRESETS["small"].to_dict(), "n_layers": 1, "n_code": 128,
                                                   "block_len": 128, "flash_chunk_len": 128, "dropsin": 0.0}


TINY_LONGVQ = dict(model=LONGVQ_BENCH_PRESETS["tiny"], lengths=(16, 32), repeats=1, isolate=False)


def test_longvq_bench_figures(tmp_path):
    result = run_longvq_bench(LongVQBenchConfig(**TINY_LONGVQ), log=lambda line: None)
    kinds = ("longvq", "longvq-relu2", "transformer", "transformer-dense")
    assert [(r["layer"], r["T"]) for r in result["rows"]] == [(k, t) for k in kinds for t in (16, 32)]
    for row in result["rows"]:
        assert row["status"] == "ok", row
        for key in ("forward_s", "fwd_bwd_s", "forward_tokens_per_s", "fwd_bwd_tokens_per_s", "parameters"):
            assert row[key] > 0, key
        assert row["forward_tokens_per_s"] == pytest.approx(row["T"] / row["forward_s"])
    rows = {(r["layer"], r["T"]): r for r in result["rows"]}
    # LongVQ's block at d_model 32, d_qk 16, d_v 64, d_ffn 64; the transformer's: qkv, output, FFN and two norms
    assert rows["transformer", 16]["parameters"] == 32 * 96 + 96 + 32 * 32 + 32 + 32 * 64 + 64 + 64 * 32 + 32 + 4 * 32
    assert rows["transformer-dense", 16]["parameters"] == rows["transformer", 16]["parameters"]
    ratios = {(r["layer"], r["T"], r["baseline"]): r for r in result["ratios"]}
    assert set(ratios) == {(k, t, b) for k in ("longvq", "longvq-relu2") for t in (16, 32)
                           for b in ("transformer", "transformer-dense")}
    mine = rows["longvq", 32]
    for baseline in ("transformer", "transformer-dense"):
        base, ratio = rows[baseline, 32], ratios["longvq", 32, baseline]
        assert ratio["forward_speedup"] == pytest.approx(base["forward_s"] / mine["forward_s"])
        assert ratio["fwd_bwd_speedup"] == pytest.approx(base["fwd_bwd_s"] / mine["fwd_bwd_s"])
    # in-process cells reuse each other's heap: no memory, and no memory ratio (isolated cells have both, below)
    assert "peak_rss_bytes" not in mine and "memory_fraction" not in ratios["longvq", 32, "transformer"]
    text = table(result)
    assert ("| fwd speedup vs transformer | fwd+bwd speedup vs transformer | memory vs transformer | fwd speedup vs "
            "transformer-dense | fwd+bwd speedup vs transformer-dense | memory vs transformer-dense |") in text
    assert "| longvq-relu2 | 32 |" in text and "| transformer | 16 |" in text
    assert "Scoring: longvq with softmax, longvq-relu2 with relu2 (--layers decides it)." in text
    widths = {line.count("|") for line in text.splitlines() if line.startswith("| ")}
    assert widths == {16}  # 15 columns in every row, header and separator included
    paths = write_report(result, tmp_path, "lvq")
    assert paths["png"].read_bytes()[:4] == b"\x89PNG" and paths["md"].read_text() == text + "\n"


def test_longvq_bench_isolated_cells_report_memory_and_skip_over_budget():
    cfg = LongVQBenchConfig(**{**TINY_LONGVQ, "isolate": True, "budget_s": 1e-9, "backward": False},
                            layers=("longvq", "transformer"))
    result = run_longvq_bench(cfg, log=lambda line: None)
    rows = {(r["layer"], r["T"]): r for r in result["rows"]}
    assert rows["longvq", 16]["peak_rss_rise_bytes"] > 0 and "fwd_bwd_s" not in rows["longvq", 16]
    assert rows["transformer", 32]["status"] == "skipped"
    assert rows["transformer", 32]["estimated_forward_s"] >= 0
    ratio = next(r for r in result["ratios"] if (r["layer"], r["T"]) == ("longvq", 16))
    assert ratio["memory_fraction"] == pytest.approx(rows["longvq", 16]["peak_rss_rise_bytes"]
                                                     / rows["transformer", 16]["peak_rss_rise_bytes"])
    assert "| transformer | 32 | skipped (est." in table(result)


def test_cli_longvq_nests_a_longvq_config():
    from transformer_vq.cli import build_parser
    from transformer_vq.cli.bench import bench_config

    cfg = bench_config(build_parser().parse_args(["bench", "longvq", "--preset", "tiny", "--d-model", "64",
                                                  "--norm", "scale", "--layers", "longvq", "--lengths", "4k"]))
    assert cfg.model == LONGVQ_BENCH_PRESETS["tiny"].replace(d_model=64, norm="scale")
    assert (cfg.model.n_layers, cfg.model.causal, cfg.layers, cfg.lengths) == (1, False, ("longvq",), (4096,))
    default = LongVQBenchConfig()
    assert default.model == LONGVQ_BENCH_PRESETS["lra-text"]  # Mega's LRA Text widths, the paper's codebook size
    assert (default.model.d_model, default.model.d_qk, default.model.d_v, default.model.n_code, default.lengths) == (
        128, 64, 256, 512, (4096, 8192, 16384))


@pytest.mark.parametrize("args, message", [
    (["--preset", "small"], "error: --preset: must be one of enwik8, tiny, lra-text, got 'small'"),
    (["--layers", "mega"], "error: --layers: must be one of longvq, longvq-relu2, transformer, transformer-dense, "
                           "got 'mega'"),
    (["--causal"], "error: the LongVQ block must be an encoder (--no-causal), as the "
                   "transformer block it is compared with"),
    (["--d-qk", "96"], "error: the transformer block splits d_model into heads of width "
                       "d_qk: d_model must be divisible by d_qk, got d_model=128, d_qk=96"),
])
def test_cli_longvq_rejects_bad_input(tmp_path, capsys, args, message):
    assert exit_code(["bench", "longvq", *args, "--no-isolate", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []


def test_longvq_bench_estimates_transformer_quadratic_longvq_linear():
    from transformer_vq.bench.longvq import _estimate

    assert _estimate("transformer", (1024, 1.0, 2.0), 4096) == (16.0, 32.0)
    assert _estimate("longvq-relu2", (1024, 1.0, None), 4096) == (4.0, 12.0)  # no backward yet: 3x the forward
    assert _estimate("longvq", None, 4096) == (None, None)


def test_triton_method_computes_what_the_eager_operator_does(monkeypatch):
    """``vq-triton`` times the fused kernels (here under Triton's interpreter) on the inputs every method reads."""
    pytest.importorskip("triton")
    import transformer_vq.ops.vq.triton as fused_ops
    from transformer_vq.bench.op_methods import make_inputs, method_fn

    calls = []
    kernel = fused_ops.attend_blocks_fused
    monkeypatch.setattr(fused_ops, "attend_blocks_fused", lambda *a, **k: calls.append(1) or kernel(*a, **k))

    cfg = OpBenchConfig(methods=("vq-triton", "vq-serial"), lengths=(64,), repeats=1, isolate=False,
                        model=PRESETS["enwik8"].replace(d_k=16, d_v=32, n_code=16, block_len=16))
    x = make_inputs(cfg, 64)
    fused, eager = method_fn("vq-triton", cfg, x)(), method_fn("vq-serial", cfg, x)()
    assert calls and fused.shape == eager.shape == (1, 1, 64, 32)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    result = run_op_bench(cfg, log=lambda line: None)
    row = next(r for r in result["rows"] if r["method"] == "vq-triton")
    assert row["status"] == "ok" and row["forward_flops"] == forward_flops("vq-serial", cfg, 64)


DECODE_ARGS = ["bench", "decode", "--contexts", "16", "--new-tokens", "1", "--d-model", "16", "--d-k", "8", "--d-v",
               "16", "--n-code", "4", "--block-len", "8", "--no-isolate", "--name", "d"]


def test_cli_exits_non_zero_naming_every_failed_cell(tmp_path, capsys, monkeypatch):
    """A benchmark goes on past a failed cell, then exits 1 naming each one with its reason (0 only when every cell
    succeeded or was skipped over the budget, as asked)."""
    real = decode.run_cell

    def fail_full(target, kwargs, **options):
        if kwargs["model"] == "full":
            return {"status": "oom", "error": "RuntimeError: out of memory (a stand-in)"}
        return real(target, kwargs, **options)

    monkeypatch.setattr(decode, "run_cell", fail_full)
    code = main([*DECODE_ARGS, "--models", "vq", "full", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.splitlines() == [
        "error: 1 of 2 cells failed:", "  model=full context=16: oom: RuntimeError: out of memory (a stand-in)",
        "see docs/benchmarks.md for each failure; a cell skipped over --budget-s is not a failure"]
    assert {p.name for p in tmp_path.iterdir()} == {"d.json", "d.md", "d.png"}  # the report is written all the same
    skipping = [*DECODE_ARGS, "--models", "vq", "--contexts", "16", "4k", "--budget-s", "1e-6", "--out", str(tmp_path)]
    assert main(skipping) == 0
    assert "| vq | 4096 | skipped" in capsys.readouterr().out


# every benchmark at tiny sizes on the command line: (benchmark, its flags, the first cell's fields)
TINY_CLI = [
    ("op", ["--methods", "vq-serial", "sdpa", "--lengths", "32", "--d-k", "8", "--d-v", "16",
            "--n-code", "8", "--block-len", "16", "--repeats", "1"], {"method": "vq-serial", "T": 32}),
    ("train", ["--models", "vq/shga", "full/shga", "--lengths", "32", "--repeats", "1", "--d-model", "16",
               "--d-k", "8", "--d-v", "16", "--n-code", "4", "--block-len", "8"], {"model": "vq/shga", "T": 32}),
    ("decode", ["--contexts", "16", "--models", "vq", "full", "--new-tokens", "1", "--d-model", "16", "--d-k", "8",
                "--d-v", "16", "--n-code", "4", "--block-len", "8"], {"model": "vq", "context": 16}),
    ("longvq", ["--lengths", "32", "--layers", "longvq", "transformer", "--repeats", "1", "--d-model", "16",
                "--d-qk", "8", "--d-v", "16", "--d-ffn", "16", "--ema-dim", "2", "--n-code", "4",
                "--block-len", "8"], {"layer": "longvq", "T": 32}),
]


@pytest.mark.parametrize("bench, argv, first", TINY_CLI)
def test_a_run_stopped_after_its_first_cell_keeps_that_cell_marked_partial(tmp_path, capsys, monkeypatch, bench,
                                                                           argv, first):
    """The files are written after every row: a timeout or a lease ending mid-run loses only the running cell."""
    import transformer_vq.bench.isolate as isolate

    real, calls = isolate.run_cell, []

    def stop_at_the_second_cell(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a timeout's signal does to the parent
        return real(*args, **kwargs)

    for module in ("op", "train", "decode", "longvq"):
        monkeypatch.setattr(f"transformer_vq.bench.{module}.run_cell", stop_at_the_second_cell)
    assert main(["bench", bench, *argv, "--no-isolate", "--out", str(tmp_path), "--name", "b"]) == 130
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["complete"] is False and saved["rows"], saved
    assert all(saved["rows"][0][k] == v for k, v in first.items()) and saved["rows"][0]["status"] == "ok"
    assert (tmp_path / "b.md").read_text().startswith(f"**Partial result: the run stopped after {len(saved['rows'])}")
    # a complete run says so and has no partial note
    capsys.readouterr()
    assert main(["bench", bench, *argv, "--no-isolate", "--out", str(tmp_path), "--name", "c"]) == 0
    done = json.loads((tmp_path / "c.json").read_text())
    assert done["complete"] is True and not (tmp_path / "c.md").read_text().startswith("**Partial")


def test_small_ratios_and_rates_keep_their_digits():
    from transformer_vq.bench.report import gflops_text, ratio_text

    assert [ratio_text(x) for x in (0.023, 0.5, 0.999, 5.34)] == ["0.023x", "0.50x", "1.00x", "5.3x"]
    assert [gflops_text(x) for x in (0.46, 37.5, 2345.6)] == ["0.46", "37.5", "2,346"]


@pytest.mark.parametrize("bench, argv, first", TINY_CLI)
def test_every_report_records_the_command_that_made_it(tmp_path, monkeypatch, bench, argv, first):
    """The JSON holds the command line as typed (``sys.argv``, quoted for a shell, ``tvq`` for the entry point's path)
    and the table a ``command:`` line, so that a result file says how to reproduce it."""
    out = tmp_path / "out dir"  # a path that needs quoting
    monkeypatch.setattr("sys.argv", ["/venv/bin/tvq", "bench", bench, *argv, "--no-isolate", "--out", str(out),
                                     "--name", "r"])
    assert main(sys.argv[1:]) == 0
    command = shlex.join(["tvq", *sys.argv[1:]])
    assert command.startswith(f"tvq bench {bench} ") and f"'{out}'" in command
    assert json.loads((out / "r.json").read_text())["command"] == command
    assert f"- command: `{command}`" in (out / "r.md").read_text().splitlines()
