"""The life of a benchmark's result dict: begun before the first cell, handed to ``progress`` after every row (a run
stopped part way keeps what it measured, marked ``complete: False``), finished with what is computed at the end.

Every ``run_*_bench`` (op, train, decode, longvq) builds its result this way, so that the saved JSON has the same
frame whichever benchmark wrote it and however far it got; :mod:`transformer_vq.bench.report` presents it.
"""

from __future__ import annotations

from dataclasses import asdict

from transformer_vq.bench.machine import machine_info


def start_result(benchmark: str, cfg, **fields) -> dict:
    """The result before any cell: the benchmark's name, its config, ``fields``, the machine, no rows yet."""
    return {"benchmark": benchmark, "config": asdict(cfg), **fields, "machine": machine_info(), "rows": [],
            "complete": False}


def finish_result(result: dict, **fields) -> dict:
    """``result`` with what is computed at the end (``fields``), the machine's load at the end, marked complete."""
    result.update(fields, load_average_end=machine_info(measure_peak=False)["load_average_start"], complete=True)
    return result


def no_progress(result: dict) -> None:
    """The default ``progress``: a caller that does not save partial results (tests, Python use)."""
