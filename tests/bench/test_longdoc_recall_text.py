"""benchmarks/longdoc_recall_text.py: the whole-split ratios and the gap by distance, from an ablate report written
here by hand (the script reads no checkpoint)."""

from __future__ import annotations

import json
import math

import pytest
from benchscripts import benchmark_script


def _script():
    return benchmark_script("longdoc_recall_text")


def _record(cell, seed, bpb, bits):
    buckets = [{"bucket": b, "queries": 10, "correct": 1, "accuracy": 0.1, "answer_bpb": x}
               for b, x in zip(("0-2", "2-4"), bits)]
    return {"cell": cell, "seed": seed, "status": "done", "final_bpb": bpb,
            "recall": {"accuracy": 0.1, "answer_bpb": sum(bits) / 2, "buckets": buckets}}


def _ablate():
    return {"command": "tvq ablate --matrix recall", "load_average_end": [1.0, 1.0, 1.0], "summary": [],
            "settings": {"seq_len": 1024, "data_options": {"n_pairs": 26, "value_len": 3, "filler": "text"}},
            "machine": {"cpu": "cpu", "logical_cpus": 2, "torch": "2.13.0", "numpy": "2", "python": "3.11",
                        "commit": "abcdef0123", "load_average_start": [1.0, 1.0, 1.0]},
            "cells": [_record("vq", 0, 2.0, [1.0, 2.0]), _record("vq", 1, 2.2, [1.0, 2.0]),
                      _record("vq-window-only", 0, 2.2, [1.0, 3.0]), _record("vq-window-only", 1, 2.2, [1.0, 3.5]),
                      _record("full", 0, 2.0, [0.5, 1.5]), _record("full", 1, 2.0, [0.5, 2.5])]}


def test_ratios_and_gaps_by_distance():
    s = _script().summarize(_ablate())
    assert s["answer_bytes_per_episode"] == 78
    assert s["guess_minus_perfect_bpb"] == pytest.approx(78 * math.log2(10) / 1024)
    assert s["cells"]["vq"]["val_bpb"] == pytest.approx(2.1)
    assert s["ratios"]["window_only_vs_vq"] == pytest.approx(2.2 / 2.1 - 1)
    assert s["ratios"]["vq_vs_full"] == pytest.approx(2.1 / 2.0 - 1)
    assert s["ratios"]["per_seed_window_only_vs_vq"] == pytest.approx([0.1, 0.0])
    assert [g["window_only_minus_vq"] for g in s["gaps"]] == pytest.approx([0.0, 1.25])
    assert [g["vq_minus_full"] for g in s["gaps"]] == pytest.approx([0.5, 0.0])
    assert s["part_gaps"] == {}  # records without the parts: no table of them


def _with_parts(record, answers, queries):
    record["recall"]["bpb"] = 0.2 + answers + queries
    record["recall"]["parts"] = {"pairs": {"bpb_share": 0.1}, "filler": {"bpb_share": 0.1},
                                 "queries": {"bpb_share": queries}, "answers": {"bpb_share": answers}}
    return record


def test_where_the_bits_go(tmp_path):
    ablate = _ablate()
    shares = {("vq", 0): (0.02, 0.03), ("vq", 1): (0.04, 0.03), ("vq-window-only", 0): (0.05, 0.06),
              ("vq-window-only", 1): (0.05, 0.06), ("full", 0): (0.02, 0.03), ("full", 1): (0.02, 0.03)}
    ablate["cells"] = [_with_parts(r, *shares[r["cell"], r["seed"]]) for r in ablate["cells"]]
    s = _script().summarize(ablate)
    assert s["cells"]["vq"]["parts"]["answers"] == pytest.approx(0.03)
    assert s["part_gaps"]["answers"]["window_only_minus_vq"] == pytest.approx(0.02)
    assert s["part_gaps"]["queries"]["window_only_minus_vq"] == pytest.approx(0.03)
    assert s["part_gaps"]["answers"]["vq_minus_full"] == pytest.approx(0.01)
    assert s["part_gaps"]["pairs"] == pytest.approx({"window_only_minus_vq": 0.0, "vq_minus_full": 0.0})
    path = tmp_path / "a.json"
    path.write_text(json.dumps(ablate))
    assert _script().main([str(path), "--name", "p", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "p.md").read_text()
    assert "| answers | 0.0300 | 0.0500 | 0.0200 | +0.0200 | +0.0100 |" in md
    assert "| all (test bpb) | 0.2600 | 0.3100 | 0.2500 | +0.0500 | +0.0100 |" in md


def test_the_files(tmp_path):
    ablate = tmp_path / "ablate.json"
    ablate.write_text(json.dumps(_ablate()))
    load = tmp_path / "load.jsonl"
    load.write_text('{"t": 1, "others_runnable": 2}\n{"t": 2, "others_runnable": 4}\n')
    assert _script().main([str(ablate), "--name", "x", "--out", str(tmp_path), "--others-load", str(load)]) == 0
    md = (tmp_path / "x.md").read_text()
    assert "None of the figures here is a timing." in md and "Window-only vs VQ: +4.76%" in md
    assert "| 2-4 | 10 | 2.000 [10%] | 3.250 [10%] | 2.000 [10%] | +1.250 | +0.000 |" in md
    assert json.loads((tmp_path / "x.json").read_text())["others_load"]["mean"] == 3.0
    assert (tmp_path / "x.png").stat().st_size > 0


def test_cells_read_from_their_run_directories(tmp_path):
    for cell, bpb, bits in (("vq", 2.0, [1.0, 2.0]), ("vq-window-only", 2.1, [1.0, 3.0])):
        run = tmp_path / f"{cell}-seed0"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"train": {"seq_len": 1024, "steps": 4, "data_options": {
            "n_pairs": 26, "value_len": 3, "filler": "text"}}}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 1.0, "bits_per_byte": 1.5, "seconds": 1.0})
                                           + "\n" + json.dumps({"step": 4, "eval": "validation", "bits_per_byte": bpb})
                                           + "\n")
        (run / "recall.json").write_text(json.dumps(_record(cell, 0, bpb, bits)["recall"]))
    script = _script()
    assert script.main(["--runs", str(tmp_path / "vq-seed0"), str(tmp_path / "vq-window-only-seed0"),
                        "--trained-by", "by hand", "--name", "y", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "y.json").read_text())["summary"]
    assert s["cells"]["vq-window-only"]["val_bpb"] == 2.1 and s["cells"]["full"]["val_bpb"] is None
    assert s["ratios"] == {} and [g["window_only_minus_vq"] for g in s["gaps"]] == pytest.approx([0.0, 1.0])
    with pytest.raises(SystemExit):
        script.main(["--runs", str(tmp_path / "vq-seed0"), "--name", "z", "--out", str(tmp_path)])
