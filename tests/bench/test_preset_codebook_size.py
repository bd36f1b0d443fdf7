"""benchmarks/preset_codebook_size.py: means over seeds, the ratio to full and the codebook ranges in its table, from
``tvq eval --json`` / ``tvq codebook --json`` files written here by hand (the script reads no checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

from benchscripts import benchmark_script


def _script():
    return benchmark_script("preset_codebook_size")


def _cell(tmp_path: Path, name: str, bpb: float, units: list[tuple[float, int, int]]) -> list[str]:
    scored, codebook = tmp_path / f"ev-{name}.json", tmp_path / f"cb-{name}.json"
    scored.write_text(json.dumps({"bits_per_byte": bpb, "tokens": 100, "carry_tokens": 2048}))
    codebook.write_text(json.dumps({"units": [{"codes": 8, "perplexity": p, "unused": u, "dead": d}
                                              for p, u, d in units]}))
    return [str(scored), str(codebook)]


def test_table_means_ratios_and_codebook_ranges(tmp_path):
    script = _script()
    cells = [["VQ", "8", "0", *_cell(tmp_path, "a", 2.2, [(3.0, 1, 0), (5.0, 4, 2)])],
             ["VQ", "8", "1", *_cell(tmp_path, "b", 2.4, [(4.0, 2, 1), (6.0, 3, 3)])]]
    result = script.collect(cells, [2.0, 2.0], {"title": "t"})
    assert result["cells"][0]["codebook"] == {"perplexity": [3.0, 5.0], "unused": [1, 4], "dead": [0, 2], "codes": 8}
    rows = script.table(result).splitlines()
    assert rows[2] == "| VQ | 8 | 2.2000 / 2.4000 | **2.3000** | 1.1500 | 3-5 / 4-6 | 1-4 / 2-3 | 0-2 / 1-3 |"
    assert rows[3].startswith("| full (any S) | - | 2.0000 / 2.0000 | **2.0000** | 1.0000 |")
