"""Stopping a training cleanly on SIGTERM / SIGINT: finish the current step, save, exit 128 + signal."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time


class StopRequest:
    """Turns the first SIGTERM / SIGINT into a request to stop after the current step; a second
    signal gets the previous behaviour back (e.g. Ctrl-C twice interrupts at once)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        self._restore()
        print(f"\n{signal.Signals(signum).name} received: finishing the current step, then saving and exiting",
              file=sys.stderr, flush=True)

    def _restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, *exc):
        self._restore()


PARENT_ENV = "TVQ_STOP_WITH_PARENT"
"""Set by a process that starts trainings as children (``tvq ablate``) to its pid: see :func:`stop_with_parent`."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_with_parent() -> None:
    """Make this process receive SIGTERM when the parent named by :data:`PARENT_ENV` dies, even by SIGKILL, so a
    training started by a killed ``tvq ablate`` saves and stops instead of running on unseen beside the rerun.

    Linux delivers it (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread watches the parent pid every
    second. A parent that died before this call is noticed at once."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    parent = int(parent)
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="stop-with-parent").start()
    if os.getppid() != parent:  # died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
