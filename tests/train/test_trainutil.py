"""The test helpers' own parts that only matter when something hangs (tests/train/trainutil.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

from trainutil import descendants, signal_all


def test_a_hung_launcher_is_found_with_its_grandchildren_and_stopped():
    # a launcher whose worker starts a session of its own, as torchrun's workers do
    script = "import os, subprocess, time; subprocess.Popen(['sleep', '60'], start_new_session=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", script]) as launcher:
        for _ in range(200):
            family = descendants(launcher.pid)
            if family:
                break
            subprocess.run(["sleep", "0.05"])
        assert len(family) == 1 and family[0] != launcher.pid
        signal_all([*family, launcher.pid], signal.SIGKILL)
        assert launcher.wait(timeout=10) == -signal.SIGKILL
    signal_all(family, signal.SIGKILL)  # already gone: no error
