"""The packing benchmark's documents: rows cut into documents of the asked mean length, positions restarting at 0."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import torch

from transformer_vq.bench import packing
from transformer_vq.bench.packing import document_positions, main
from transformer_vq.ops.documents import document_starts


def test_rows_are_cut_into_documents_of_the_mean_length():
    positions = document_positions(4, 5000, 50, seed=3)
    assert positions.shape == (4, 5000)
    starts = document_starts(4, 5000, position_ids=positions)  # valid packed positions, or this raises
    assert bool(starts[:, 0].all())
    mean = starts.numel() / int(starts.sum())
    assert 40 < mean < 60, mean
    assert torch.equal(positions, document_positions(4, 5000, 50, seed=3))


def test_the_benchmark_runs_end_to_end_at_a_tiny_size(tmp_path, capsys, monkeypatch):
    """A smoke test, not a timing (about 15 s on a quiet 2-core CPU): the table with each case's peak memory and the
    others' load, and the JSON, both with the command as typed."""
    out = tmp_path / "packing.json"
    monkeypatch.setattr("sys.argv", [packing.__file__, "--preset", "tiny", "--block-len", "8", "--length", "32",
                                     "--batch-size", "1", "--mean-doc", "8", "--repeats", "1", "--rounds", "1",
                                     "--out", str(out)])
    assert main(sys.argv[1:]) == 0
    printed = capsys.readouterr().out
    command = shlex.join(["python", "-m", "transformer_vq.bench.packing", *sys.argv[1:]])
    assert printed.startswith(f"command: {command}\n") and json.loads(out.read_text())["command"] == command
    assert "packed, mean document 8" in printed and "others: runnable threads of other processes" in printed
    assert "peak MiB" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [row["case"] for row in rows] == ["unpacked", "packed, mean document 8"]
    assert all(row["step_s"] > 0 and row["samples"] >= 1 for row in rows)
    assert all(row["peak_bytes"] > 0 for row in rows)  # measured in each case's own process


@pytest.mark.parametrize("flags, message", [
    (["--length", "0"], "error: --length: must be a positive integer, got '0'"),
    (["--mean-doc", "-5"], "error: --mean-doc: must be a positive integer, got '-5'"),
    (["--mean-doc", "8", "8"], "error: --mean-doc: each length once, got 8 8"),
    (["--rounds", "0"], "error: --rounds: must be a positive integer, got '0'"),
    (["--seed", "-1"], "error: --seed: must be an integer >= 0, got '-1'"),
    (["--device", "foo"], "error: --device: invalid choice: 'foo' (choose from 'cpu', 'cuda')"),
], ids=["length", "mean-doc", "repeated-mean-doc", "rounds", "seed", "device"])
def test_bad_values_are_refused_in_one_line(capsys, flags, message):
    with pytest.raises(SystemExit) as stop:
        main(["--preset", "tiny", *flags])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == message


def test_an_out_that_cannot_be_written_is_refused_before_the_first_step(tmp_path, capsys, monkeypatch):
    from transformer_vq.bench import packing

    monkeypatch.setattr(packing, "run", lambda args: pytest.fail("the run started"))
    (tmp_path / "file").write_text("")
    for out, message in [(tmp_path / "file" / "x.json", "is a file, not a directory"), (tmp_path, "is a directory")]:
        with pytest.raises(SystemExit) as stop:
            main(["--preset", "tiny", "--out", str(out)])
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_block_length_is_the_presets_unless_given(monkeypatch):
    from transformer_vq.bench import packing

    seen = []
    monkeypatch.setattr(packing, "run", lambda args: seen.append(args.block_len) or pytest.skip("checked"))
    with pytest.raises(pytest.skip.Exception):
        main(["--preset", "tiny"])
    assert seen == [8]
