"""Stopping a training cleanly on SIGTERM / SIGINT: finish the current step, save, exit 128 + signal."""

from __future__ import annotations

import signal
import sys
import threading


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
