"""The others' load while a benchmark runs: how many threads of other processes wanted the CPU meanwhile.

A load average counts the benchmark's own threads too, and lags by a minute. :class:`OthersLoad` samples, in a
background thread, the runnable threads of the machine (``procs_running`` of ``/proc/stat``) less those of this
process and its descendants (the worker processes a benchmark spawns: state ``R`` in
``/proc/<pid>/task/<tid>/stat``, the tree read from ``/proc/<pid>/task/<tid>/children``), and reports their mean
and maximum over the samples. A timing taken while others ran is slower by about their share of the cores: a reader
can tell a quiet run from a shared one. Linux only; elsewhere the samples are ``None``.

A sample reads a few small files (tens of microseconds), never every process of the machine: the sampler runs
beside the timed calls and holds the GIL while it reads, so a scan of all of ``/proc`` (about 10 ms) slowed the very
calls it watched, the Python-heavy ones most.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")


def others_runnable() -> int | None:
    """Threads of other processes (not this one, not its descendants) runnable now; ``None`` without ``/proc``."""
    try:
        machine = next(int(line.split()[1]) for line in (PROC / "stat").read_text().splitlines()
                       if line.startswith("procs_running "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    ours = sum(_runnable_threads(pid) for pid in _tree(os.getpid()))
    # the two reads are instants apart: a thread of ours that started running in between is not someone else's
    return max(0, machine - ours)


def _tree(root: int) -> set[int]:
    """``root`` and its descendants, from the ``children`` list of every thread of each."""
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        try:
            for task in (PROC / str(pid) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split() if int(c) not in found)
        except (OSError, ValueError):  # the process ended while being read
            continue
    return found


def _runnable_threads(pid: int) -> int:
    """Threads of process ``pid`` in state ``R`` (0 when it ended while being read)."""
    try:
        return sum(_stat_fields(task / "stat")[0] == "R" for task in (PROC / str(pid) / "task").iterdir())
    except (OSError, IndexError):
        return 0


def _stat_fields(path: Path) -> list[str]:
    """``[state, ppid, ...]`` of a ``stat`` file (after the command name, which may hold spaces)."""
    text = path.read_text()
    return text[text.rindex(")") + 2:].split()


class OthersLoad:
    """``with OthersLoad() as load: ...`` samples :func:`others_runnable` every ``interval`` seconds meanwhile;
    afterwards ``load.samples`` holds the samples and ``load.summary()`` their :func:`load_summary`."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            sample = others_runnable()
            if sample is not None:
                self.samples.append(sample)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "OthersLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """:func:`load_summary` of the samples taken."""
        return load_summary(self.samples)


def load_summary(samples: list[int]) -> dict:
    """``{"others_runnable_mean", "others_runnable_max", "samples"}`` of samples of :func:`others_runnable` (the
    mean and maximum ``None`` when there are none)."""
    if not samples:
        return {"others_runnable_mean": None, "others_runnable_max": None, "samples": 0}
    return {"others_runnable_mean": round(sum(samples) / len(samples), 2), "others_runnable_max": max(samples),
            "samples": len(samples)}


def load_text(summary: dict) -> str:
    """A :func:`load_summary` in words, for a printed line."""
    if summary["samples"] == 0:
        return "others' load: unknown (no /proc)"
    return (f"others' load: {summary['others_runnable_mean']} runnable threads on average, at most "
            f"{summary['others_runnable_max']} ({summary['samples']} samples)")
