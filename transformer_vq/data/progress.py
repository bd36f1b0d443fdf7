"""What a long build of the data cache says on stderr: what it builds and where, then how far it has come.

A corpus is built into the cache once, and the first build can be long (ListOps' 100,000 expressions take minutes of
CPU, PG-19's tokenization about an hour); a command that is silent meanwhile looks hung. So every build first says
what it builds and where it is cached (:func:`building`, the one place that line is written, whatever the dataset),
then counts its items: a tqdm bar when stderr is a terminal (:func:`on_terminal`, the rule of ``tvq eval``'s and
``tvq sample``'s bars), otherwise one plain line every :data:`PERIOD_S` seconds, so that a log file gets a readable
trace rather than a bar's carriage returns. A load from the cache says nothing.

The builders stay free of any reporting: they take the count as a plain callable, an :data:`Advance` called with the
number of items just done, and whoever watches nothing passes :func:`no_progress`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

Advance = Callable[[int], None]
# Seconds between two progress lines off a terminal: a build of an hour leaves about a hundred lines in a log.
PERIOD_S = 30.0


def no_progress(done: int = 1) -> None:
    """The :data:`Advance` of a build nobody watches."""


def on_terminal() -> bool:
    """Whether progress is drawn as a bar: stderr, where it goes, is a terminal (a file or a pipe gets lines)."""
    return sys.stderr.isatty()


def _quiet() -> bool:
    """A torchrun worker other than its machine's first: the workers all load the corpus at once and share the
    terminal, and one report a machine is enough (each machine may have its own cache to build). Read from torchrun's
    own variable, as ``cli.quiet_worker`` does, and ``LOCAL_RANK`` rather than its ``RANK``."""
    return "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("LOCAL_RANK", "0") != "0"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else \
        f"{seconds / 3600:.1f} h"


def _count(number: int, unit: str) -> str:
    return f"{number:,} {unit}{'' if number == 1 else 's'}"


class Progress:
    """An :data:`Advance` that reports the count of ``unit`` (out of ``total`` when known) of the build ``what``: on
    a bar, or in lines (see the module). ``unit`` None: a build too quick to count, and ``silent``: a worker that
    says nothing, count nothing. A context manager, which closes it when the build ends."""

    def __init__(self, what: str, total: int | None = None, unit: str | None = None, *, silent: bool = False):
        self.what, self.total, self.unit = what, total, unit
        self.counting = unit is not None and not silent
        self.done, self.lines = 0, 0
        self.start = self.said = time.monotonic()
        self.bar = None
        if self.counting and on_terminal():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit=unit, leave=False, file=sys.stderr)

    def __call__(self, done: int = 1) -> None:
        if not self.counting:
            return
        self.done += done
        if self.bar is not None:
            self.bar.update(done)
        elif time.monotonic() - self.said >= PERIOD_S:
            self.said = time.monotonic()
            self.lines += 1
            _say(self.line())

    def line(self) -> str:
        """``listops: 12,000/100,000 expressions (12%), 50 s, about 6 min left``."""
        elapsed = time.monotonic() - self.start
        if not self.total:
            return f"{self.what}: {_count(self.done, self.unit)}, {_duration(elapsed)}"
        left = elapsed * (self.total - self.done) / self.done if 0 < self.done < self.total else None
        return (f"{self.what}: {self.done:,}/{_count(self.total, self.unit)} ({100 * self.done / self.total:.0f}%), "
                f"{_duration(elapsed)}" + (f", about {_duration(left)} left" if left is not None else ""))

    def close(self) -> None:
        """Take the bar down; off a terminal, a build that said how far it had come also says that it ended."""
        if self.bar is not None:
            self.bar.close()
        elif self.lines:
            _say(f"{self.what}: built, {_count(self.done, self.unit)} in {_duration(time.monotonic() - self.start)}")
        self.lines = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def building(what: str, where: str | os.PathLike, total: int | None = None, unit: str | None = None) -> Progress:
    """Say that ``what`` is being built into the cache at ``where``, before the work, and return the
    :class:`Progress` of its count of ``unit`` (``total`` of them when known): ``with building(...) as advance:``.
    A build too quick to count (``unit`` None) just calls it."""
    quiet = _quiet()
    if not quiet:
        size = f" ({_count(total, unit)})" if total and unit else ""
        _say(f"building {what}{size}, cached at {Path(where)}")
    return Progress(what, total, unit, silent=quiet)
