"""Concurrency: one training per run directory. A second one (fresh or resumed) is refused while the first
holds the run's lock, naming it; the lock of a dead process is taken over."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cliutil import process_env, run_cli, tiny_train, tvq
from transformer_vq.train.checkpoint.rundir import LOCK_NAME

IN_USE = ("error: run directory {run} is in use by another training (pid {pid} on {host}, started {started}); wait "
          "for it to finish or stop it, or pass another --run-dir")


def hold_lock(run_dir, pid: int) -> int:
    """Take the run's lock as a training would (flock plus its record); returns the descriptor."""
    run_dir.mkdir(exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": pid, "host": socket.gethostname(), "started": "2024-01-01 00:00:00"}).encode())
    return fd


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_second_training_is_refused_while_the_lock_is_held(corpus, finished_run, resume):
    fd = hold_lock(finished_run, os.getpid())
    try:
        extra = ["--resume", "--steps", "4"] if resume else []
        proc = tvq(tiny_train(corpus, finished_run, *extra), cwd=finished_run.parent)
    finally:
        os.close(fd)
    assert (proc.returncode, proc.stderr) == (2, IN_USE.format(
        run=finished_run, pid=os.getpid(), host=socket.gethostname(), started="2024-01-01 00:00:00") + "\n")
    assert [p.name for p in (finished_run / "checkpoints").iterdir()] == ["latest", "step_00000002"]


def test_stale_lock_of_a_dead_process_is_taken_over(capsys, corpus, finished_run):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2024-01-01 00:00:00"}
    (finished_run / LOCK_NAME).write_text(json.dumps(record))
    code, err = run_cli(capsys, tiny_train(corpus, finished_run, "--resume", "--steps", "3"))
    assert code == 0, err
    assert not (finished_run / LOCK_NAME).exists()
    assert (finished_run / "checkpoints" / "latest").read_text().strip() == "step_00000003"


def test_two_real_trainings_at_once(corpus, tmp_path):
    """A real first training holds the lock; the second process is refused; SIGTERM stops the first with a
    checkpoint and the command to continue."""
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "transformer_vq",
                              *tiny_train(corpus, run_dir, "--steps", "100000", "--ckpt-every", "100000")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env(),
                             cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").stat().st_size):
            if first.poll() is not None or time.monotonic() > deadline:
                first.kill()  # (communicate() of a live training would wait for its 100,000 steps)
                pytest.fail(f"the first training ended or logged no step in 120 s: {first.communicate()}")
            time.sleep(0.05)
        started = json.loads((run_dir / LOCK_NAME).read_text())["started"]
        second = tvq(tiny_train(corpus, run_dir, "--resume", "--steps", "3"), cwd=tmp_path)
        assert (second.returncode, second.stderr) == (2, IN_USE.format(
            run=run_dir, pid=first.pid, host=socket.gethostname(), started=started) + "\n")
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    # the whole stderr in every message: a failure seen once under load was not captured
    assert first.returncode == 143 and "Traceback" not in err, (first.returncode, err)
    assert err.splitlines()[-1].startswith("stopped at step "), err
    assert err.splitlines()[-1].endswith(f"; continue with: tvq train --resume auto --run-dir {run_dir}"), err
    assert not (run_dir / LOCK_NAME).exists()
