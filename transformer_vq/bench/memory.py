"""The peak memory of one benchmark cell: the process's resident set high-water mark over the cell alone, or on a GPU
the CUDA allocator's peak.

A cell often shares its process with others (interleaved rounds, several contexts of one prompt, the persistent workers
of benchmarks/jax_layer.py), so the lifetime peak (``ru_maxrss``) would say nothing of the cell. Linux keeps a
resettable high-water mark: writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` (``/proc/self/status``) to the
current RSS, and ``VmHWM`` read after the cell is the cell's peak. Where that is not allowed (not Linux, a locked-down
``/proc``) the reading falls back to ``ru_maxrss``, the process's peak since it started (``source`` says which: an
upper bound then). On CUDA the peak is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.

Standard library only (torch only for a GPU, imported then): the JAX worker of benchmarks/jax_layer.py loads this file
by path, in an environment without this project.
"""

from __future__ import annotations

import importlib
import resource
import sys
from pathlib import Path

_PROC_SELF = Path("/proc/self")


def _status_kib(key: str) -> int | None:
    """A ``/proc/self/status`` figure in KiB (``VmHWM``, ``VmRSS``); None without it."""
    try:
        for line in (_PROC_SELF / "status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_bytes() -> int | None:
    """The process's resident set size now; None where ``/proc`` does not say."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Set the process's RSS high-water mark to its RSS now; False where the kernel does not allow it."""
    try:
        (_PROC_SELF / "clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def peak_rss_bytes() -> tuple[int, str]:
    """``(bytes, source)``: the RSS high-water mark (``"VmHWM"``, since the last :func:`reset_peak_rss`) or, without
    it, the process's lifetime peak (``"ru_maxrss"``: KiB on Linux, bytes on macOS)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024, "VmHWM"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024), "ru_maxrss"


class PeakMemory:
    """``with PeakMemory(device) as peak: cell()``; then :meth:`figures` gives the cell's peak. Entered again, it keeps
    the highest figures over all its windows (one method's calls spread over interleaved rounds).

    On the CPU: ``peak_rss_bytes`` (the highest RSS of the process during the windows), ``peak_rss_rise_bytes`` (the
    most a window's peak rose above the RSS when it began: what the cell itself added, whatever the process held
    before) and ``peak_rss_source``. On CUDA: ``cuda_peak_bytes``, the most the caching allocator held allocated.
    """

    def __init__(self, device: str = "cpu"):
        # only a GPU cell needs torch here (see the module docstring)
        self.cuda = importlib.import_module("torch").cuda if str(device).startswith("cuda") else None
        self.start = self.peak = self.rise = None
        self.source = ""

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            self.cuda.synchronize()
            self.cuda.reset_peak_memory_stats()
        else:
            reset_peak_rss()
            self.start = rss_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.cuda.synchronize()
            peak = self.cuda.max_memory_allocated()
        else:
            peak, self.source = peak_rss_bytes()
            if self.start is not None:
                self.rise = max(self.rise or 0, peak - self.start)
        self.peak = max(self.peak or 0, peak)

    def figures(self, prefix: str = "") -> dict:
        """The peak as JSON-ready fields (see the class docstring), each name after ``prefix``."""
        if self.cuda:
            return {f"{prefix}cuda_peak_bytes": self.peak}
        return {f"{prefix}peak_rss_bytes": self.peak, f"{prefix}peak_rss_rise_bytes": self.rise,
                f"{prefix}peak_rss_source": self.source}
