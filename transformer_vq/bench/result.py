"""The life of a benchmark's result dict: begun before the first cell, handed to ``progress`` after every row (a run
stopped part way keeps what it measured, marked ``complete: False``), finished with what is computed at the end.

Every ``run_*_bench`` (op, train, decode, longvq) builds its result this way, so that the saved JSON has the same
frame whichever benchmark wrote it and however far it got; :mod:`transformer_vq.bench.report` presents it.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from transformer_vq.bench.machine import machine_info


def command_line(argv: list[str] | None = None) -> str:
    """The command that started this process (``sys.argv``), quoted for a shell: ``tvq ...`` for the ``tvq`` entry
    point and ``python -m transformer_vq``, ``python -m MODULE ...`` for another module of this package, else
    ``python SCRIPT ...`` as typed."""
    argv = list(sys.argv if argv is None else argv) or [""]
    program, package = Path(argv[0]).resolve(), Path(__file__).resolve().parents[1]
    if Path(argv[0]).name == "tvq" or program == package / "__main__.py":
        head = ["tvq"]
    elif program.suffix == ".py" and program.is_relative_to(package):
        head = ["python", "-m", ".".join(program.relative_to(package.parent).with_suffix("").parts)]
    else:
        head = ["python", argv[0]]
    return shlex.join(head + argv[1:])


def start_result(benchmark: str, cfg, **fields) -> dict:
    """The result before any cell: the benchmark's name, the command that ran it, its config, ``fields``, the
    machine, no rows yet."""
    return {"benchmark": benchmark, "command": command_line(), "config": asdict(cfg), **fields,
            "machine": machine_info(), "rows": [], "complete": False}


def finish_result(result: dict, **fields) -> dict:
    """``result`` with what is computed at the end (``fields``), the machine's load at the end, marked complete."""
    result.update(fields, load_average_end=machine_info(measure_peak=False)["load_average_start"], complete=True)
    return result


def no_progress(result: dict) -> None:
    """The default ``progress``: a caller that does not save partial results (tests, Python use)."""
