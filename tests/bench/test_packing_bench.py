"""The packing benchmark's documents: rows cut into documents of the asked mean length, positions restarting at 0."""

from __future__ import annotations

import json

import torch

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


def test_the_benchmark_runs_end_to_end_at_a_tiny_size(tmp_path, capsys):
    """A smoke test, not a timing (about 15 s on a quiet 2-core CPU): the table with each case's peak memory and the
    others' load, and the JSON."""
    out = tmp_path / "packing.json"
    assert main(["--preset", "tiny", "--block-len", "8", "--length", "32", "--batch-size", "1", "--mean-doc", "8",
                 "--repeats", "1", "--rounds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "packed, mean document 8" in printed and "others: runnable threads of other processes" in printed
    assert "peak MiB" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [row["case"] for row in rows] == ["unpacked", "packed, mean document 8"]
    assert all(row["step_s"] > 0 and row["samples"] >= 1 for row in rows)
    assert all(row["peak_bytes"] > 0 for row in rows)  # measured in each case's own process
