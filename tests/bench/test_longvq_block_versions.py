"""benchmarks/longvq_block_versions.py: the ratios against every baseline named (the fused and the materialized
full-attention blocks), from samples written here by hand (no cell is run)."""

from __future__ import annotations

import pytest
from benchscripts import benchmark_script

MIB = 2**20


def test_ratios_table_and_plot_against_two_baselines(tmp_path):
    script = benchmark_script("longvq_block_versions")
    variants = {label: {"rev": "WORKTREE", "kind": kind, "commit": "abcdef0123"}
                for label, kind in (("longvq", "longvq"), ("sdpa", "transformer"), ("dense", "transformer-dense"))}
    samples = {  # (label, T, mode) -> per round (seconds, peak rise bytes); rounds interleaved
        ("longvq", 4096, "fwd"): [(1.0, 80 * MIB), (2.0, 90 * MIB), (1.0, 70 * MIB)],
        ("sdpa", 4096, "fwd"): [(1.5, 40 * MIB), (2.0, 45 * MIB), (1.0, 30 * MIB)],
        ("dense", 4096, "fwd"): [(4.0, 900 * MIB), (6.0, 800 * MIB), (2.0, 850 * MIB)],
    }
    rows = {r["variant"]: r for r in script.ratio_rows(samples, variants, ["sdpa", "dense"])}
    mine = rows["longvq"]
    assert mine["median_s"] == 1.0 and mine["peak_rise_bytes"] == 90 * MIB
    assert mine["speedup_vs"] == {"sdpa": pytest.approx(1.0), "dense": pytest.approx(3.0)}  # medians of 1.5 1 1 / 4 3 2
    assert mine["memory_vs"] == {"sdpa": pytest.approx(2.0), "dense": pytest.approx(0.1)}
    assert rows["dense"]["speedup_vs"]["dense"] == 1.0
    lines = script.table_lines(list(rows.values()), list(variants), ["sdpa", "dense"])
    assert lines[0] == ("| T | mode | variant (rev, block) | median s | speed vs sdpa | speed vs dense | peak rise MiB "
                        "| memory vs sdpa | memory vs dense |")
    assert lines[2] == "| 4096 | fwd | longvq (abcdef0, longvq) | 1.000 | 1.00x | 3.00x | 90 | 2.00x | 0.10x |"
    assert {line.count("|") for line in lines} == {10}
    script.plot({"baselines": ["sdpa", "dense"], "rows": list(rows.values())}, tmp_path / "ratios.png")
    assert (tmp_path / "ratios.png").read_bytes()[:4] == b"\x89PNG"
