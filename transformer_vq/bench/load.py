"""The others' load while a benchmark runs: how many threads of other processes wanted the CPU meanwhile.

A load average counts the benchmark's own threads too, and lags by a minute. :class:`OthersLoad` samples, in a
background thread, the runnable threads (state ``R`` in ``/proc/<pid>/task/<tid>/stat``) of every process that is
neither this one nor one of its descendants (the worker processes a benchmark spawns), and reports their mean and
maximum over the samples. A timing taken while others ran is slower by about their share of the cores: a reader can
tell a quiet run from a shared one. Linux only; elsewhere the samples are ``None``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")


def others_runnable() -> int | None:
    """Threads of other processes (not this one, not its descendants) runnable now; ``None`` without ``/proc``."""
    try:
        parents, running = {}, {}
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parents[int(entry.name)] = int(_stat_fields(entry / "stat")[1])
                running[int(entry.name)] = sum(_stat_fields(task / "stat")[0] == "R"
                                               for task in (entry / "task").iterdir())
            except (OSError, IndexError, ValueError):  # the process ended while being read
                continue
    except OSError:
        return None
    ours = {os.getpid()}
    grew = True
    while grew:  # descendants: processes whose parent is ours, to a fixed point
        new = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= new
        grew = bool(new)
    return sum(n for pid, n in running.items() if pid not in ours)


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
