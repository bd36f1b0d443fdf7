"""Stopping a training cleanly on SIGTERM / SIGINT: finish the current step, save, exit 128 + signal."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


class StopRequest:
    """Turns the first SIGTERM / SIGINT into a request to stop after the current step; a second
    signal gets the previous behaviour back (e.g. Ctrl-C twice interrupts at once). ``announce``: whether this
    process says so (under torchrun rank 0 only: every worker gets the signal, and the run stops as one); ``hold``:
    whether a loop that fails holds the signals off until the caller's teardown (:func:`hold_signals`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    entered = 0
    """Training loops of this process inside their request now."""
    left = 0
    """Training loops of this process that have ended (stopped or finished)."""

    def __init__(self, announce: bool = True, hold: bool = False):
        self.signum: int | None = None
        self.announce, self.hold = announce, hold
        self._previous = {}

    def __enter__(self):
        StopRequest.entered += 1
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        self._restore()
        if self.announce:
            print(f"\n{signal.Signals(signum).name} received: finishing the current step (and a validation due), "
                  f"then saving and exiting", file=sys.stderr, flush=True)

    def _restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, exc_type, *exc):
        self._restore()
        StopRequest.entered -= 1
        StopRequest.left += 1
        if self.hold and exc_type is not None and issubclass(exc_type, Exception):
            hold_signals()


_HELD: dict = {}
"""The handlers :func:`hold_signals` replaced, until :func:`release_signals` puts them back."""


def hold_signals() -> None:
    """After a training loop that failed, until :func:`release_signals` (the trainer's caller, once the process group
    is torn down): a SIGTERM / SIGINT is noted, not obeyed. The error on its way out ends the process with its one
    line (a lost or stalled worker's, from the command line); torchrun SIGTERMs the other workers the moment one
    fails, and the signal, arriving during the teardown, ended the worker silently (exit -15) before it said why. A
    second signal gets the previous behaviour back, so a teardown that hangs can still be interrupted."""
    if _HELD or threading.current_thread() is not threading.main_thread():
        return
    for sig in StopRequest.SIGNALS:
        _HELD[sig] = signal.signal(sig, _noted)


def _noted(signum, frame) -> None:
    release_signals()


def release_signals() -> None:
    """Put back the handlers :func:`hold_signals` replaced (nothing when none are held)."""
    for sig, handler in _HELD.items():
        signal.signal(sig, handler)
    _HELD.clear()


PARENT_ENV = "TVQ_STOP_WITH_PARENT"
"""Set by a process that starts trainings as children (``tvq ablate``) to its pid: see :func:`stop_with_parent`."""
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"
"""Set by torchrun for every worker it starts (``RANK`` alone is set by other launchers too)."""
_WATCHED: set[int] = set()
"""The parents :func:`stop_with_parent` watches already."""


def stop_with_parent() -> None:
    """Make this process receive SIGTERM when the parent that started it dies, even by SIGKILL, so a training
    started by a killed ``tvq ablate`` or ``torchrun`` saves and stops instead of running on unseen beside the rerun
    (torchrun's workers lead sessions of their own: its death reached none of them). The parent is the one
    :data:`PARENT_ENV` names, else, in a torchrun worker (:data:`TORCHRUN_ENV`), torchrun's agent, which starts its
    workers itself; no other process is armed.

    A daemon thread watches the parent pid every second and sends one SIGTERM; a parent that died before this call is
    noticed at once. None once the training loop has ended: the process ends by itself, and torchrun's workers notice
    the death each in its own second, so the others may have stopped already for the first one's signal (a late
    SIGTERM killed one after its save, before it said how to continue). Not Linux's ``prctl(PR_SET_PDEATHSIG)``:
    the kernel sends that signal again each time it re-parents the child, through every thread of a dying parent
    with several (torchrun's agent and ``tvq ablate``'s runner have several), and the second SIGTERM ended the
    training mid-save, as a second signal does."""
    named = os.environ.get(PARENT_ENV)
    if not named and TORCHRUN_ENV not in os.environ:
        return
    parent = int(named) if named else os.getppid()
    if parent not in _WATCHED:  # armed once (the command line arms a torchrun worker, ablate's cell its child)
        _WATCHED.add(parent)
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="stop-with-parent").start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    if StopRequest.entered or not StopRequest.left:  # a training stops after its step; before one, the process ends
        os.kill(os.getpid(), signal.SIGTERM)
