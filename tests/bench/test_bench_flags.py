"""What the benchmarks do with what they are given, before any cell runs: a model flag no cell reads is refused by
name, a model that cannot run the benchmark is refused, ``--out`` is checked up front; and how a failure that is not
the cell's is reported (a memory limit too small to start, no cell measured).

Every test here stops before a cell is timed, or runs one trivial cell, so the file takes seconds.
"""

from __future__ import annotations

import warnings

import pytest

from transformer_vq.bench.config import OP_READS, DecodeBenchConfig, LongVQBenchConfig, OpBenchConfig
from transformer_vq.bench.isolate import _start_failure, run_cell
from transformer_vq.bench.reads import unread_problems
from transformer_vq.bench.report import plot
from transformer_vq.cli import build_parser, main
from transformer_vq.cli.bench import bench_config
from transformer_vq.config import ConfigError, LongVQConfig, TransformerVQConfig
from transformer_vq.config.fields import fields_of

OP = ["op", "--lengths", "64", "--methods", "vq-serial", "--d-k", "16", "--d-v", "32", "--n-code", "16",
      "--block-len", "16", "--repeats", "1", "--no-backward"]
OP_UNREAD = ("tvq bench op times the methods named by --methods on inputs of the layer's sizes (n_head, head_type, "
             "d_k, d_v, n_code, block_len, flash_chunk_len); this field is not read by them")


def exit_code(argv: list[str]) -> int:
    """The exit status of ``tvq ARGV``: flag errors exit while parsing, later errors are returned."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def refusal(tmp_path, capsys, argv: list[str]) -> str:
    """The error line of ``tvq bench ARGV``, checked to exit 2 and to write nothing under ``--out``."""
    out = tmp_path / "out"
    assert exit_code(["bench", *argv, "--no-isolate", "--out", str(out)]) == 2
    assert not out.exists()
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("flags, message", [
    (["--no-compressive-cache"], f"error: --compressive-cache: {OP_UNREAD}"),
    (["--cache-bias-init=-6"], f"error: --cache-bias-init: {OP_UNREAD}"),
    (["--reduction", "matmul"], f"error: --reduction: {OP_UNREAD}"),
    (["--attn-backend", "triton"], f"error: --attn-backend: {OP_UNREAD}"),
    (["--attn-type", "full"], f"error: --attn-type: {OP_UNREAD}"),
    (["--flash-chunk-len", "32"], "error: --flash-chunk-len: applies only with attn_type 'flash' (this run has "
                                  "attn_type 'vq'), got 32; leave it out, or set attn_type as it needs (here --methods "
                                  "sets attn_type)"),
], ids=["compressive-cache", "cache-bias", "reduction", "backend", "attn-type", "flash-chunk-len"])
def test_op_refuses_model_flags_its_methods_do_not_read(tmp_path, capsys, flags, message):
    assert refusal(tmp_path, capsys, [*OP, *flags]) == message


def test_op_reads_exactly_the_layer_sizes_so_a_new_model_field_is_refused_until_read():
    cells = OpBenchConfig(methods=("vq-serial", "flash")).cells()
    refused = {name for name, _ in unread_problems(TransformerVQConfig, cells, fields_of(TransformerVQConfig))}
    assert refused == set(fields_of(TransformerVQConfig)) - set(OP_READS)


def test_op_honors_the_sizes_its_methods_read():
    cfg = bench_config(build_parser().parse_args(["bench", "op", "--methods", "vq-serial", "flash", "--n-code", "16",
                                                  "--flash-chunk-len", "32", "--n-head", "1"]))
    assert (cfg.model.n_code, cfg.model.flash_chunk_len) == (16, 32)


def test_mask_rate_on_a_causal_model_is_refused_as_tvq_train_refuses_it(tmp_path, capsys):
    assert exit_code(["train", "--preset", "tiny", "--mask-rate", "0.3", "--run-dir", str(tmp_path / "r")]) == 2
    train = capsys.readouterr().err.strip()
    assert train.startswith("error: --mask-rate: applies only with causal false (this run has causal true), got 0.3")
    bench = refusal(tmp_path, capsys, ["train", "--preset", "tiny", "--models", "vq/shga", "--mask-rate", "0.3"])
    assert bench == train
    assert refusal(tmp_path, capsys, [*OP, "--mask-rate", "0.3"]) == train + " (here --methods sets causal)"


@pytest.mark.parametrize("argv, message", [
    (["train", "--models", "vq/shga", "--attn-type", "full"], "error: --attn-type: --models sets it for each cell"),
    (["train", "--models", "vq/shga", "full/shga", "--head-type", "mqa"],
     "error: --head-type: --models sets it for each cell"),
    (["train", "--models", "vq/shga", "--n-head", "2"],
     "error: --n-head: a shga model has one head, and --models names no mqa or mha model"),
    (["train", "--models", "full/shga", "--n-code", "16"],
     "error: --n-code: applies only with attn_type 'vq' (this run has attn_type 'full'), got 16; leave it out, or set "
     "attn_type as it needs (here --models sets attn_type)"),
    (["train", "--models", "vq/shga", "full/shga", "--reduction", "matmul"],
     "error: --reduction: applies only with attn_type 'vq' and causal true and compressive_cache true (this run has "
     "attn_type 'full'), got 'matmul'; leave it out, or set attn_type as it needs (in cell full/shga of --models)"),
    (["decode", "--dropres", "0.1"], "error: --dropres: tvq bench decode trains nothing, and this field acts only in "
                                     "training"),
    (["decode", "--models", "vq", "--attn-type", "full"], "error: --attn-type: --models sets it for each cell"),
], ids=["train-attn-type", "train-head-type", "train-n-head", "train-n-code", "train-cell-model", "decode-dropout",
        "decode-attn-type"])
def test_train_and_decode_refuse_model_flags_no_cell_reads(tmp_path, capsys, argv, message):
    assert refusal(tmp_path, capsys, argv) == message


def test_train_and_decode_honor_fields_some_cell_reads():
    parse = build_parser().parse_args
    cfg = bench_config(parse(["bench", "train", "--models", "vq/shga", "full/mha", "--n-head", "2", "--n-code", "16"]))
    assert (cfg.cell_model("vq/shga").n_head, cfg.cell_model("full/mha").n_head, cfg.model.n_code) == (1, 2, 16)
    cfg = bench_config(parse(["bench", "decode", "--models", "vq", "--reduction", "matmul"]))
    assert cfg.cell_model("vq").reduction == "matmul"


def test_train_takes_n_head_with_a_single_head_preset():
    # the tiny preset is 'shga' (one head): the cells set head_type, so --n-head is for its mqa/mha cells
    cfg = bench_config(build_parser().parse_args(["bench", "train", "--preset", "tiny", "--models", "vq/mha",
                                                  "vq/shga", "--n-head", "4"]))
    assert [(m.head_type, m.n_head) for m in map(cfg.cell_model, cfg.models)] == [("mha", 4), ("shga", 1)]


def test_decode_refuses_an_encoder_up_front(tmp_path, capsys):
    assert refusal(tmp_path, capsys, ["decode", "--preset", "tiny", "--models", "vq", "--no-causal"]) == (
        "error: tvq bench decode generates tokens, and an encoder (causal false) has no "
        "decoding state to generate from; leave out --no-causal")
    with pytest.raises(ConfigError, match="an encoder"):
        DecodeBenchConfig(model=DecodeBenchConfig().model.replace(causal=False))


@pytest.mark.parametrize("flags, message", [
    (["--layers", "longvq", "--scoring", "relu2"],
     "error: --scoring: --layers sets it for each block (longvq: softmax, longvq-relu2: relu2)"),
    (["--n-layers", "4"], "error: --n-layers: tvq bench longvq times one block on random embeddings, which this field "
                          "does not change"),
    (["--layers", "transformer", "--n-code", "16"],
     "error: --n-code: the transformer, transformer-dense blocks read only d_model, d_qk, d_ffn, dropout, causal"),
], ids=["scoring", "n-layers", "transformer-n-code"])
def test_longvq_refuses_model_flags_no_block_reads(tmp_path, capsys, flags, message):
    assert refusal(tmp_path, capsys, ["longvq", "--preset", "tiny", *flags]) == message


def test_longvq_honors_a_field_one_block_reads():
    cfg = LongVQBenchConfig(layers=("longvq", "transformer"))
    assert unread_problems(LongVQConfig, cfg.cells(), ["n_code", "d_model", "dead_code_restart"]) == []


def test_out_that_is_a_file_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    import transformer_vq.bench.op as op

    monkeypatch.setattr(op, "run_op_bench", lambda *a, **k: pytest.fail("a cell ran"))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert exit_code(["bench", *OP, "--no-isolate", "--out", str(afile)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --out: {afile} is a file, not a directory; remove it or "
                                               "choose another path")
    assert afile.read_text() == "keep"


def test_a_memory_limit_too_small_to_import_torch_says_so():
    row = run_cell("transformer_vq.bench.op:op_cell", {}, isolate=True, timeout_s=120, mem_limit_gib=0.2)
    assert row["status"] == "error"
    assert row["error"].startswith("--mem-limit-gib 0.2 is too small for a cell's process to even start (importing "
                                   "its code failed: ")
    assert row["error"].endswith("raise --mem-limit-gib, or give 0 for no limit")
    # an import that fails for another reason is reported as itself
    assert _start_failure(ImportError("No module named 'x'"), 2**30) == {
        "status": "error", "error": "ImportError: No module named 'x'"}


def test_a_child_that_dies_before_it_can_report_under_a_limit_says_the_limit_is_too_small(monkeypatch):
    """Under a limit of a few MiB Python's own start-up fails (a bare MemoryError on stderr, no result line)."""
    import subprocess

    died = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback (most recent call last):\nMemoryError\n")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: died)
    row = run_cell("transformer_vq.bench.op:op_cell", {}, isolate=True, mem_limit_gib=0.01)
    assert row["error"] == ("--mem-limit-gib 0.01 is too small for a cell's process to even start (it ended with "
                            "MemoryError); raise --mem-limit-gib, or give 0 for no limit")
    row = run_cell("transformer_vq.bench.op:op_cell", {}, isolate=True)  # no limit: the error as it came
    assert row["error"] == "MemoryError"


def test_a_report_with_no_measured_cell_plots_without_a_warning(tmp_path):
    result = {"benchmark": "train", "rows": [{"model": "vq/shga", "T": 16, "status": "error", "error": "x"}],
              "machine": {"cpu": "cpu", "torch_threads": 1, "torch": "2"}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name, message", [
    ("../escape", "must be a file name stem, not a path (the directory is --out), got '../escape'"),
    ("", "must not be empty, got ''"),
])
def test_a_name_that_is_no_file_stem_is_refused_before_anything_runs(tmp_path, capsys, name, message):
    with pytest.raises(SystemExit) as stop:  # an argparse refusal
        main(["bench", "op", "--out", str(tmp_path / "out"), "--name", name])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == f"error: --name: {message}"
    assert not (tmp_path / "out").exists()
