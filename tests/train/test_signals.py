"""SIGTERM and SIGINT finish the current step, save a checkpoint and exit with 143 / 130."""

from __future__ import annotations

import signal
import time

import pytest

from trainutil import cli_args, read_metrics, tvq_process
from transformer_vq.train.checkpoint import latest_checkpoint


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_and_exits(corpus_file, tmp_path, sig, code):
    run_dir = tmp_path / "run"
    # far more steps than can run, and no periodic checkpoint: only the signal can cause a save
    proc = tvq_process(cli_args(corpus_file, run_dir, "steps=100000", "ckpt_every=100000"))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(read_metrics(run_dir)) < 3:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"{sig.name} received: finishing the current step, then saving and exiting" in err
    last_step = read_metrics(run_dir)[-1]["step"]
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and ckpt.step == last_step
    assert f"stopped at step {last_step}; continue with: tvq train --resume auto --run-dir {run_dir}" in err


PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, "TVQ_STOP_WITH_PARENT": str(os.getpid())})
print(child.pid, flush=True)
time.sleep(60)
"""
CHILD = """
import signal, sys, time
from transformer_vq.train.signals import stop_with_parent
signal.signal(signal.SIGTERM, lambda *a: sys.exit(43))  # a training saves here, then exits
stop_with_parent()
print("armed", flush=True)
time.sleep(60)
"""


def test_a_child_started_to_stop_with_its_parent_gets_sigterm_when_the_parent_is_killed():
    """What `tvq ablate` gives its trainings: its kill -9 reaches them as SIGTERM (they save and stop)."""
    import os
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", f"CHILD = {CHILD!r}\n{PARENT}"], stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    assert parent.stdout.readline() == "armed\n"  # the child shares its parent's stdout
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its killed parent")
