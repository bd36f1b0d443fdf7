"""Every results file names the command that produced it, so a reader can rerun it: each benchmark script that writes
a JSON result either records ``command_line()`` (transformer_vq.bench.result) or writes through
``result_files.write_result``, which adds it to the JSON and the table. Scripts are found by globbing benchmarks/, so
a new script that writes its own JSON without the command fails here."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.bench.benchscripts import benchmark_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
# scripts whose JSON is not a result: a worker's messages, a per-rank report gathered by its parent
NOT_RESULTS = {"worker_protocol.py", "result_files.py"}
WRITERS = [p for p in sorted(BENCH.glob("*.py"))
           if p.name not in NOT_RESULTS and re.search(r"json\.dumps?\(", p.read_text())]


@pytest.mark.parametrize("script", WRITERS, ids=lambda p: p.name)
def test_a_script_that_writes_a_result_records_its_command(script):
    text = script.read_text()
    assert "command_line()" in text or "write_result(" in text, (
        f"{script.name} writes JSON without the command that ran it: add \"command\": command_line()")


def test_write_result_adds_the_command_to_the_json_and_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["benchmarks/some_bench.py", "--steps", "3", "--note", "a b"])
    result_files = benchmark_script("result_files")
    result_files.write_result({"rows": [1]}, "| a |\n", tmp_path, "r")
    command = "python benchmarks/some_bench.py --steps 3 --note 'a b'"
    assert json.loads((tmp_path / "r.json").read_text()) == {"command": command, "rows": [1]}
    assert (tmp_path / "r.md").read_text() == f"| a |\n\nCommand: `{command}`\n"
    # a result that names its own command keeps it
    result_files.write_result({"command": "mine"}, "t", tmp_path, "s")
    assert json.loads((tmp_path / "s.json").read_text())["command"] == "mine"
