"""benchmarks/history_mass.py: its table and figure from a result written here by hand (the measurement itself is
tests/train/lm/test_history_mass.py's)."""

from __future__ import annotations

from benchscripts import benchmark_script


def _result():
    def run(label, step, masses):
        return {"label": label, "run": f"runs/{label}", "step": step, "units": 2, "mean": [m[-1] for m in masses],
                "by_history": [{"blocks": [2, 4], "mass": [masses[0][0], masses[1][0]]},
                               {"blocks": [4, 8], "mass": [masses[0][1], masses[1][1]]}]}
    return {"name": "t", "notes": {"k": "a note"},
            "machine": {"cpu": "cpu", "torch": "2.13.0", "commit": "abc"},
            "runs": [run("vq", 600, [[0.25, 0.5], [0.1, 0.125]]), run("vq", 0, [[0.5, 0.75], [0.5, 0.875]])]}


def test_rows_per_run_and_unit(tmp_path):
    script = benchmark_script("history_mass")
    text = script.table(_result())
    assert "| vq | 600 | 0 | **50.0%** | 25.0% | 50.0% |" in text
    assert "| vq | 0 | 1 | **87.5%** | 50.0% | 87.5% |" in text and "- k: a note" in text
    assert script.plot(_result(), tmp_path / "t.png").is_file()
