"""The run directory: one clear error when it is a file, read-only or on a full disk, and an exclusive
lock so that two trainings never write the same run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainutil import cli_args, read_metrics, tiny_config, tvq_process
from transformer_vq.train import CheckpointError, train
from transformer_vq.train.checkpoint import latest_checkpoint, list_checkpoints
from transformer_vq.train.checkpoint.rundir import LOCK_NAME, RunDirError, RunLock
from transformer_vq.train.metrics import MetricsLogger


def test_run_dir_that_is_a_file(corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    with pytest.raises(RunDirError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=1"))
    assert isinstance(err.value, CheckpointError)  # the command line prints it and exits 2
    assert str(err.value) == (f"run directory {run_dir} is a file, not a directory; pass another --run-dir, "
                              f"or move the file away")


def test_read_only_run_dir(corpus_file, tmp_path, monkeypatch):
    # chmod does not stop root: the file system's refusal is simulated where the library meets it
    run_dir = tmp_path / "run"
    original_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == run_dir:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return original_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(RunDirError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=1"))
    assert str(err.value) == (f"cannot create the run directory: {run_dir} is not writable (Permission denied); "
                              f"pass a writable --run-dir, or fix the directory's permissions")
    monkeypatch.undo()

    # an existing run directory on a read-only file system
    run_dir.mkdir()
    original_open = os.open

    def read_only_open(path, flags, *args):
        if str(path).endswith(LOCK_NAME):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return original_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only_open)
    with pytest.raises(RunDirError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=1"), resume="auto")
    assert str(err.value) == (f"cannot lock the run directory: {run_dir / LOCK_NAME} is not writable (Read-only "
                              f"file system); pass a writable --run-dir, or fix the directory's permissions")


def test_full_disk_while_saving_keeps_the_previous_checkpoint(corpus_file, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    original_save = torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:  # the second checkpoint hits a full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return original_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=3 * 2**19))
    with pytest.raises(RunDirError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=4", "ckpt_every=2"))
    assert str(err.value) == (f"cannot save checkpoint step_00000004: no space left on the disk holding {run_dir} "
                              f"(1.5 MiB free; nothing saved before was changed); free some space, or pass another "
                              f"--run-dir on a disk with room")
    monkeypatch.undo()
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000002"]  # no half-written debris
    assert latest_checkpoint(root).step == 2 and not (run_dir / LOCK_NAME).exists()
    assert train(tiny_config(corpus_file, run_dir, "steps=4", "ckpt_every=2"), resume="auto").step == 4


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _hold(path: Path, record: dict) -> int:
    """Take the lock file's flock in this process, as another training would, with ``record`` in it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps(record).encode())
    return fd


def test_stale_locks_are_taken_over(corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = {"pid": _dead_pid(), "host": socket.gethostname(), "started": "2024-01-01 00:00:00"}
    # a lock file its killed holder left behind (the kernel released the flock)
    (run_dir / LOCK_NAME).write_text(json.dumps(dead))
    assert train(tiny_config(corpus_file, run_dir, "steps=1")).exit_code == 0
    assert not (run_dir / LOCK_NAME).exists()
    # still locked, by a leftover of a dead training (a child that inherited the descriptor)
    fd = _hold(run_dir / LOCK_NAME, dead)
    try:
        assert train(tiny_config(corpus_file, run_dir, "steps=2"), resume="auto").step == 2
    finally:
        os.close(fd)


def test_lock_held_by_a_live_process_is_refused(tmp_path):
    live = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2024-01-01 00:00:00"}
    fd = _hold(tmp_path / LOCK_NAME, live)
    try:
        with pytest.raises(RunDirError) as err:
            RunLock(tmp_path).acquire()
    finally:
        os.close(fd)
    assert str(err.value) == (f"run directory {tmp_path} is in use by another training (pid {os.getpid()} on "
                              f"{socket.gethostname()}, started 2024-01-01 00:00:00); wait for it to finish or "
                              f"stop it, or pass another --run-dir")
    lock = RunLock(tmp_path)
    lock.acquire()  # released: free again
    lock.release()
    assert list(tmp_path.iterdir()) == []


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_second_training_on_the_same_run_dir_is_refused(corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    first = tvq_process(cli_args(corpus_file, run_dir, "steps=100000", "ckpt_every=100000"))
    try:
        lock = run_dir / LOCK_NAME
        _wait_for(lambda: lock.is_file() and f'"pid": {first.pid}' in lock.read_text() and read_metrics(run_dir),
                  first)
        started = json.loads(lock.read_text())["started"]
        message = (f"run directory {run_dir} is in use by another training (pid {first.pid} on "
                   f"{socket.gethostname()}, started {started}); wait for it to finish or stop it, or pass "
                   f"another --run-dir")
        second = tvq_process(cli_args(corpus_file, run_dir, "steps=3"))
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and err == f"error: {message}\n"
        with pytest.raises(RunDirError) as resumed:  # resuming it is refused the same way
            train(tiny_config(corpus_file, run_dir, "steps=100000", "ckpt_every=100000"), resume="auto")
        assert str(resumed.value) == message
        assert first.poll() is None  # the first training goes on
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 143
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(1, len(steps) + 1))  # one writer only
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"step_{steps[-1]:08d}"]
    assert not (run_dir / LOCK_NAME).exists()


def test_full_disk_while_writing_metrics_names_the_path_and_the_free_space(corpus_file, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"

    def log_step(self, metrics):
        if metrics["step"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "metrics.jsonl"))

    monkeypatch.setattr(MetricsLogger, "log_step", log_step)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
    with pytest.raises(RunDirError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=4", "ckpt_every=2"))
    metrics = run_dir / "metrics.jsonl"
    assert str(err.value) == (f"cannot write metrics.jsonl: no space left on the disk holding {metrics} (0.0 MiB "
                              f"free; nothing saved before was changed); free some space, or pass another --run-dir "
                              f"on a disk with room")
    monkeypatch.undo()
    assert latest_checkpoint(run_dir / "checkpoints").step == 2  # the checkpoint before is intact and resumable
    assert train(tiny_config(corpus_file, run_dir, "steps=4", "ckpt_every=2"), resume="auto").step == 4


def test_an_unexplained_failure_names_the_run_directory_once(tmp_path):
    """`--run-dir /proc/nope` said "cannot create the run directory in run directory /proc/nope" (helper-75 P5)."""

    from transformer_vq.train.checkpoint.rundir import disk_error

    run_dir = tmp_path / "nope" / "run"
    made = disk_error(OSError(errno.ENOENT, "No such file or directory"), run_dir, "create the run directory")
    assert str(made).startswith(f"cannot create the run directory {run_dir}: No such file or directory (")
    saved = disk_error(OSError(errno.EIO, "Input/output error"), run_dir, "save checkpoint step_00000001")
    assert str(saved).startswith(f"cannot save checkpoint step_00000001 in run directory {run_dir}: Input/output")
