"""`tvq ablate` on a tiny matrix (in this process, for speed): report numbers from the records, a killed matrix
resumed (finished cells skipped, the unfinished one continued from its checkpoint), settings guard, the shipped
matrices' configs."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import torch

from transformer_vq.ablate import AblateConfig, Matrix, run_ablation
from transformer_vq.ablate.cells import cell_config
from transformer_vq.ablate.report import command_line
from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.config.ablate import MATRICES
from transformer_vq.data import DataError

TINY = Matrix("tiny", "two codebook sizes", {"S4": ("n_code=4",), "S8": ("n_code=8",)}, reference="S8",
              base=("block_len=8",))


def tiny_settings(tmp_path, **changes):
    return AblateConfig(**{"matrix": "codebook", "preset": "tiny", "data": "shakespeare", "steps": 4, "seeds": (0, 1),
                           "seq_len": 32, "update_len": 16, "batch_size": 2, "eval_every": 2, "eval_tokens": 128,
                           "ckpt_every": 2, "work_dir": str(tmp_path / "work"), "out": str(tmp_path / "out"),
                           "name": "tiny", **changes})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ablate")
    cfg = tiny_settings(tmp_path, seeds=(0,))
    lines = []
    result = run_ablation(cfg, matrix=TINY, isolate=False, log=lines.append)
    return cfg, result, lines


def test_every_cell_trained_with_curves_and_the_report_written(finished):
    cfg, result, lines = finished
    assert [line.split("]")[0] for line in lines if line.endswith("done")] == ["[cell 1/2", "[cell 2/2"]
    for record in result["cells"]:
        assert record["status"] == "done" and record["steps"] == [1, 2, 3, 4]
        assert [v["step"] for v in record["validation"]] == [2, 4]  # every eval_every steps, and at the end
        assert record["seconds"] == sorted(record["seconds"]) and record["train_seconds"] > 0
        assert record["final_bpb"] == record["validation"][-1]["bits_per_byte"]
        assert len(record["codebook_perplexity"]) == 4
    assert {p.split("/")[-1] for p in result["paths"].values()} == {
        "tiny.json", "tiny.md", "tiny-curves.png", "tiny-final.png", "tiny-codebook.png"}
    saved = json.loads(open(result["paths"]["json"]).read())
    assert saved["machine"]["commit"] and saved["command"] == command_line(cfg)


def test_resume_skips_finished_cells_and_continues_the_unfinished_one(finished):
    cfg, result, _ = finished
    work = cfg.resolved_work_dir()
    first_metrics = open(f"{work}/runs/S4-seed0/metrics.jsonl").read()
    # as if the matrix had been killed after S8's last checkpoint, before its record was written
    (tmp_record := __import__("pathlib").Path(f"{work}/cells/S8-seed0.json")).unlink()
    lines = []
    again = run_ablation(cfg, matrix=TINY, isolate=False, log=lines.append)
    assert lines[0] == "[1/2] S4-seed0: finished earlier, skipped"
    assert open(f"{work}/runs/S4-seed0/metrics.jsonl").read() == first_metrics  # S4 did not run
    rows = [json.loads(line) for line in open(f"{work}/runs/S8-seed0/metrics.jsonl")]
    # S8 resumed at its step-4 checkpoint: no step trained again, the final validation rerun for the record but
    # logged once
    assert [r["step"] for r in rows if "eval" not in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "eval" in r] == [2, 4]
    assert tmp_record.is_file() and again["cells"][1]["final_bpb"] == rows[-1]["bits_per_byte"]


def test_markdown_table_by_hand(tmp_path):
    cfg = tiny_settings(tmp_path)
    records = [{"cell": c, "seed": s, "status": "done", "final_bpb": b, "train_seconds": t}
               for c, s, b, t in (("S4", 0, 2.0, 10.0), ("S4", 1, 2.2, 12.0), ("S8", 0, 1.9, 20.0),
                                  ("S8", 1, 2.1, 22.0))]
    from transformer_vq.ablate.report import summarize_cells

    rows = summarize_cells(TINY, records)
    assert rows[0]["mean_bpb"] == pytest.approx(2.1) and rows[0]["std_bpb"] == pytest.approx(statistics.stdev([2, 2.2]))
    assert rows[0]["ratio"] == pytest.approx(2.1 / 2.0) and rows[1]["ratio"] == 1.0
    from transformer_vq.ablate.report import table

    text = table({"matrix": {"name": "tiny", "description": "d", "base": [], "reference": "S8"}, "summary": rows,
                  "settings": cfg.to_dict(), "command": "tvq ablate", "machine": _machine(), "cells": records})
    assert "| S4 | n_code=4 | 2 | 2.1000 +- 0.1414 | 2.0000 .. 2.2000 | 1.0500 | 11 |" in text
    assert "- machine: cpu, 2 logical CPUs" in text and "matmul" not in text  # an ablation measures no matmul rate
    # one seed measures no spread: '-' and None, not a zero (it was reported as +- 0.0000)
    one = summarize_cells(TINY, [r for r in records if r["seed"] == 0])
    assert one[0]["std_bpb"] is None
    text = table({"matrix": {"name": "tiny", "description": "d", "base": [], "reference": "S8"}, "summary": one,
                  "settings": cfg.to_dict(), "command": "tvq ablate", "machine": _machine(), "cells": records})
    assert "| S4 | n_code=4 | 1 | 2.0000 +- - | 2.0000 .. 2.0000 |" in text


def test_codebook_figures_go_to_the_run_not_into_a_checkpoint():
    """``tvq codebook --ckpt RUN/best`` wrote its figures and a TensorBoard log inside RUN/best/step_N."""
    from pathlib import Path

    from transformer_vq.ablate.codebook import run_dir_of

    assert run_dir_of("r/best/step_00000004") == run_dir_of("r/checkpoints/step_00000004") == Path("r")
    assert run_dir_of("r") == Path("r")


def test_a_cell_finished_by_another_matrix_is_reused_not_retrained(finished, tmp_path):
    """S8 at the same settings is the same training in any matrix: a sibling work directory's record is copied."""
    cfg, result, _ = finished
    other = Matrix("other", "S8 again and S2", {"S2": ("n_code=2",), "eight": ("n_code=8",)}, reference="eight",
                   base=("block_len=8",))
    sibling = dataclasses.replace(cfg, work_dir=str(Path(cfg.work_dir).parent / "work-other"),
                                  out=str(tmp_path), name="other")
    lines = []
    again = run_ablation(sibling, matrix=other, isolate=False, log=lines.append)
    reused = [line for line in lines if line.endswith("reused")]
    assert reused == [f"[2/2] eight-seed0: identical to {Path(cfg.work_dir).resolve()}/runs/S8-seed0, reused"]
    eight = again["cells"][1]
    source = next(r for r in result["cells"] if r["cell"] == "S8")
    assert eight["cell"] == "eight" and eight["final_bpb"] == source["final_bpb"]
    assert not (Path(sibling.work_dir) / "runs" / "eight-seed0" / "metrics.jsonl").exists()
    assert f"- eight seed 0: {Path(cfg.work_dir).resolve()}/runs/S8-seed0" in open(again["paths"]["md"]).read()
    assert (Path(sibling.work_dir) / "runs" / "S2-seed0" / "metrics.jsonl").is_file()  # S2 is new: trained
    # the copy is this matrix's own record now: a rerun finds it here
    lines = []
    run_ablation(sibling, matrix=other, isolate=False, log=lines.append)
    assert lines[1] == "[2/2] eight-seed0: finished earlier, skipped"


def _machine():
    return {"cpu": "cpu", "logical_cpus": 2, "torch_threads": 2, "memory_gib": 1, "cpu_flags": [],
            "load_average_start": None, "torch": "t", "numpy": "n", "python": "p", "commit": "c", "date_utc": "d"}


def test_other_settings_in_the_same_work_dir_are_refused(finished):
    cfg, _, _ = finished
    with pytest.raises(ConfigError, match=r"holds a matrix started with other settings \(steps differ\)"):
        run_ablation(tiny_settings(__import__("pathlib").Path(cfg.work_dir).parent, seeds=(0,), steps=5),
                     matrix=TINY, isolate=False, log=lambda *a: None)


@pytest.mark.parametrize("name", list(MATRICES))
def test_shipped_matrices_build_their_configs(name, tmp_path):
    cfg = AblateConfig(matrix=name)
    matrix = MATRICES[name]
    configs = [cell_config(cfg, matrix, cell, 0, tmp_path) for cell in matrix.cells]
    # the recall matrix brings its own data, length and model (tests/bench/test_ablate_recall.py)
    # the preset matrix keeps the shipped preset's L = 64
    seq_len, block_len, data = {"recall": (1024, 32, "recall"), "attention-long": (8192, 128, "gcide"),
                                "preset": (2048, 64, "gcide")}.get(name, (2048, 128, "gcide"))
    assert {c.train.seq_len for c in configs} == {seq_len} and {c.model.block_len for c in configs} == {block_len}
    assert all(c.train.data == data for c in configs)


def test_jobs_train_cells_at_once_in_their_own_processes(tmp_path):
    """--jobs 2: the second training starts before the first has finished; records and report as one at a time."""
    cfg = tiny_settings(tmp_path, seeds=(0,), jobs=2, threads=1)
    lines = []
    result = run_ablation(cfg, matrix=TINY, log=lines.append)
    assert [r["cell"] for r in result["cells"]] == ["S4", "S8"] and {r["status"] for r in result["cells"]} == {"done"}
    runs = Path(cfg.work_dir) / "runs"
    # S8's request was written while S4 was still training (S4 writes metrics up to its end)
    assert (runs / "S8-seed0" / "request.json").stat().st_mtime < (runs / "S4-seed0" / "metrics.jsonl").stat().st_mtime
    assert sorted(line.split("]")[0] for line in lines if line.endswith("done")) == ["[cell 1/2", "[cell 2/2"]
    assert "--jobs 2" in result["command"]


def test_cells_picks_what_trains_and_a_later_run_finishes_the_matrix(tmp_path):
    lines = []
    first = run_ablation(tiny_settings(tmp_path, seeds=(0,), cells=("S8",)), matrix=TINY, isolate=False,
                         log=lines.append)
    assert [r["cell"] for r in first["cells"]] == ["S8"] and [r["cell"] for r in first["summary"]] == ["S8"]
    assert "| S4 |" not in Path(first["paths"]["md"]).read_text()
    lines.clear()
    whole = run_ablation(tiny_settings(tmp_path, seeds=(0,)), matrix=TINY, isolate=False, log=lines.append)
    assert "[2/2] S8-seed0: finished earlier, skipped" in lines  # S4 trained now, S8 kept from the first run
    assert [r["cell"] for r in whole["cells"]] == ["S4", "S8"]
    assert whole["cells"][1]["final_bpb"] == first["cells"][0]["final_bpb"]


def test_unknown_cells_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"cells 'S16' are not in matrix 'tiny' \(S4, S8\)"):
        run_ablation(tiny_settings(tmp_path, cells=("S8", "S16")), matrix=TINY, isolate=False, log=lambda *a: None)
    assert not (tmp_path / "work").exists()


def test_a_set_of_a_field_the_cells_set_is_refused_before_anything_is_written(tmp_path):
    """The cell's own value is applied after --set and wins: the override would change nothing, and the report
    would show the cell's value."""
    with pytest.raises(ConfigError) as err:
        run_ablation(tiny_settings(tmp_path, overrides=("d_model=32", "n_code=16")), matrix=TINY, isolate=False,
                     log=lambda *a: None)
    assert str(err.value) == ("--set n_code=16: cell 'S4' of matrix 'tiny' sets n_code=4 itself, and a cell's own "
                              "value wins over --set; leave --set n_code out, or leave out the cells that set it "
                              "(--cells)")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("item, advice", [
    ("seed=7", "use --seeds"), ("train.batch_size=1", "use --batch-size"), ("seq_len=512", "use --seq-len"),
    ("data_options={}", "use --data-option"), ("keep_ckpts=3", "a cell keeps its newest checkpoint"),
    ("name=x", "a cell's run directory is under --work-dir"), ("sample_prompt=hi", "cells sample nothing"),
])
def test_a_set_of_a_field_tvq_ablate_sets_for_every_cell_is_refused_naming_its_flag(tmp_path, item, advice):
    """A training field every cell takes from tvq ablate's own flags won over --set: a cell trained with batch 2
    and seed 0 under --set batch_size=1 seed=7, and the report named the --set."""
    from transformer_vq.config.ablate import CELL_TRAIN_FIELDS

    settings = tiny_settings(tmp_path, overrides=("warmup_steps=1", item))  # warmup_steps: ablate leaves it
    assert set(settings.cell_train(0, "")) <= set(CELL_TRAIN_FIELDS)  # every field it sets has its advice
    with pytest.raises(ConfigError) as err:
        run_ablation(settings, matrix=TINY, isolate=False, log=lambda *a: None)
    key = item.split("=")[0].removeprefix("train.")
    assert str(err.value) == f"--set {item}: tvq ablate sets {key} itself for every cell; {advice}"
    assert not (tmp_path / "work").exists()


def test_a_set_that_applies_to_no_cell_is_refused_and_one_that_applies_to_some_is_theirs(tmp_path):
    """mask_rate where every cell is causal trained the same model (identical losses) under a report naming it;
    n_code applies to the VQ cells of a matrix that also has a full-attention one, and is taken."""
    with pytest.raises(ConfigError) as err:
        run_ablation(tiny_settings(tmp_path, overrides=("mask_rate=0.3",)), matrix=TINY, isolate=False,
                     log=lambda *a: None)
    assert str(err.value) == ("--set mask_rate=0.3: mask_rate applies only with causal false, and no cell of this "
                              "run has that (causal true): it would change nothing; leave it out")
    assert not (tmp_path / "work").exists()
    mixed = Matrix("mixed", "vq and full", {"vq": (), "full": ("attn_type=full",)}, reference="vq",
                   base=("block_len=8",))
    settings = tiny_settings(tmp_path, overrides=("n_code=6",), seeds=(0,), steps=2, threads=1)
    with pytest.raises(ConfigError, match="--set n_code=6: n_code applies only with attn_type 'vq'"):
        run_ablation(dataclasses.replace(settings, cells=("full",)), matrix=mixed, isolate=False, log=lambda *a: None)
    result = run_ablation(settings, matrix=mixed, isolate=False, log=lambda *a: None)
    assert result["cells"][0]["status"] == "done"
    assert result["machine"]["torch_threads"] == 1  # the cells' --threads, not the runner's own count


def test_a_preset_that_changes_no_cell_is_said():
    """The recall matrix's base sets every field in which tiny differs from small: --preset tiny trained small's
    cells without a word."""
    from transformer_vq.ablate.cells import cell_config, preset_note
    from transformer_vq.config.ablate import MATRICES

    for name, said in (("recall", True), ("codebook", False)):
        cfg = AblateConfig(matrix=name, preset="tiny", seeds=(0,))
        matrix = cfg.chosen(MATRICES[name])
        configs = {(cell, 0): cell_config(cfg, matrix, cell, 0, Path("w")) for cell in matrix.cells}
        note = preset_note(cfg, matrix, configs, Path("w"))
        assert (note is not None) == said, name


def test_a_field_of_another_architecture_is_refused_without_advising_an_arch_flag(tmp_path):
    """tvq ablate trains Transformer-VQ cells only: it has no --arch to advise (tvq train's refusal does)."""
    with pytest.raises(ConfigError) as err:
        run_ablation(tiny_settings(tmp_path, overrides=("n_classes=3",)), matrix=TINY, isolate=False,
                     log=lambda *a: None)
    assert str(err.value).endswith("model field(s) n_classes belong to arch 'longvq'; this command trains arch 'tvq' "
                                   "only: leave them out")
    assert not (tmp_path / "work").exists()


def test_an_unknown_data_option_is_refused_before_anything_is_written(tmp_path):
    """The dataset's own option check runs before the first cell, as --set's does (not once per cell and seed)."""
    with pytest.raises(DataError, match=r"^dataset 'shakespeare' has no option 'bogus'; its options are: fractions"):
        run_ablation(tiny_settings(tmp_path, data_options={"bogus": 3}), matrix=TINY, isolate=False,
                     log=lambda *a: None)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
    """docs/benchmarks.md: a report that cannot be written is refused before the first cell, not after the matrix."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--out: .*file is a file, not a directory"):
        run_ablation(tiny_settings(tmp_path, out=str(tmp_path / "file")), matrix=TINY, isolate=False,
                     log=lambda *a: None)
    assert not (tmp_path / "work").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(ValueError, match="no CUDA GPU is available"):
        run_ablation(tiny_settings(tmp_path, device="cuda"), matrix=TINY, isolate=False, log=lambda *a: None)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
    assert main(["ablate", "--matrix", "codebook", "--device", "cuda", "--work-dir", str(tmp_path / "work")]) == 2
    assert capsys.readouterr().err.strip() == ("error: --device: cuda was requested but no CUDA GPU is available; "
                                               "use --device cpu (or auto)")


@pytest.mark.parametrize("name", ["../escape", "sub/dir", ".", ""])
def test_a_name_that_is_no_file_stem_is_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="name must"):
        tiny_settings(tmp_path, name=name)


def test_the_cell_runner_says_its_usage_and_refuses_a_missing_request_in_one_line(capsys, tmp_path):
    """``python -m transformer_vq.ablate`` (docs/quality.md's way to rerun one cell) answered --help, no argument
    and a missing request file with a traceback."""
    from transformer_vq.ablate.cells import main as cell_main

    with pytest.raises(SystemExit) as stop:
        cell_main(["--help"])
    assert stop.value.code == 0 and "request.json in the cell's run directory" in capsys.readouterr().out
    for argv in ([], [str(tmp_path / "missing.json"), "recall"], [str(tmp_path), "other"]):
        with pytest.raises(SystemExit) as stop:
            cell_main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith("usage: python -m transformer_vq.ablate")
        assert "Traceback" not in err
