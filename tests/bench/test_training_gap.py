"""benchmarks/training_gap.py: the ranges, the per-range means and ratios, and the validation rows, from run
directories whose metrics.jsonl is written here by hand (the script reads no checkpoint)."""

from __future__ import annotations

import argparse
import json

import pytest
from benchscripts import benchmark_script


def _script():
    return benchmark_script("training_gap")


def _run(tmp_path, name, bpb_of_step, steps=8, evals=((8, 2.0),)):
    run = tmp_path / name
    run.mkdir()
    rows = [{"step": s, "loss": 1.0, "bits_per_byte": bpb_of_step(s), "seconds": 0.1} for s in range(1, steps + 1)]
    rows += [{"step": s, "eval": "validation", "bits_per_byte": v} for s, v in evals]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(run)


def test_doubling_ranges_end_at_the_last_step():
    script = _script()
    assert script.doubling_ranges(600) == [(1, 60), (61, 120), (121, 240), (241, 480), (481, 600)]
    assert script.doubling_ranges(60) == [(1, 60)]
    assert script.parse_ranges("1-4,5-8") == [(1, 4), (5, 8)]
    for bad in ("5-1", "x", "1-2-3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a step range lo-hi"):
            script.parse_ranges(bad)


def test_a_note_is_key_equals_text_refused_while_parsing_otherwise():
    """--note of every script that writes one result (result_files.add_output_args): a note without a key was a
    traceback after the runs were read."""
    note = benchmark_script("result_files").note
    assert note("title=a=b") == ("title", "a=b") and note(" k =") == ("k", "")
    assert note("machine = 2 cores ") == ("machine", "2 cores")  # the value was kept as ' 2 cores ', the key stripped
    for bad in ("no-equals", "=text", " =x"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be KEY=TEXT"):
            note(bad)


def test_ratios_by_range_and_validation(tmp_path):
    script = _script()
    ref = [_run(tmp_path, "ref0", lambda s: 2.0), _run(tmp_path, "ref1", lambda s: 4.0)]
    other = [_run(tmp_path, "x0", lambda s: 3.0 if s <= 4 else 3.3, evals=((8, 2.2),)),
             _run(tmp_path, "x1", lambda s: 3.0 if s <= 4 else 3.3, evals=((8, 2.4),))]
    result = {"name": "t", **script.collect([["ref", *ref], ["x", *other]], "ref", [(1, 4), (5, 8)], {})}
    text = script.table(result)
    # the reference's mean is 3.0 in both ranges; x's 3.0 then 3.3
    assert "| ref (bpb) | 2 | 3.0000 | 3.0000 |" in text and "| x | 2 | 1.0000 | 1.1000 |" in text
    assert "2.2000 / 2.4000; **2.3000** (1.1500)" in text
    assert script.plot(result, tmp_path / "t.png").is_file()


def test_refusals(tmp_path):
    script = _script()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no training rows"):
        script.collect([["a", str(empty)]], "a", None, {})
    run = _run(tmp_path, "r", lambda s: 1.0)
    with pytest.raises(SystemExit, match="not one of the cells"):
        script.collect([["a", run]], "b", None, {})


def test_a_cell_of_fewer_runs_is_paired_with_the_same_seeds(tmp_path):
    script = _script()
    ref = [_run(tmp_path, "ref0", lambda s: 2.0, evals=((8, 2.0),)), _run(tmp_path, "ref1", lambda s: 4.0,
                                                                           evals=((8, 4.0),))]
    one = [_run(tmp_path, "x0", lambda s: 2.2, evals=((8, 2.2),))]
    text = script.table({"name": "t", **script.collect([["ref", *ref], ["x", *one]], "ref", [(1, 8)], {})})
    assert "| x | 1 | 1.1000 |" in text and "2.2000; **2.2000** (1.1000)" in text  # against ref0, not the mean 3.0
