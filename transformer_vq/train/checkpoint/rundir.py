"""The run directory as a place to write: one clear error for an unusable one, and an exclusive lock
so that two trainings never write the same run at once.

Errors: a run directory that is a file, is not writable, or sits on a full disk raises
:class:`RunDirError` naming the path and what to do (the command line prints it and exits 2),
instead of the ``OSError`` traceback of whichever write failed first.

Lock: a training (fresh or resumed) holds ``fcntl.flock`` on ``RUN_DIR/.lock`` while it runs, with
its pid and host written in the file for the message a second training gets. The kernel releases a
``flock`` when its holder dies, so the lock of a killed training is simply taken over; a lock file
still held although the pid in it is dead on this host (a leftover child of the dead process that
inherited the descriptor) is replaced. Under ``torchrun`` only rank 0 holds it: the workers of one
run share its directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

from transformer_vq.train.checkpoint.errors import CheckpointError

LOCK_NAME = ".lock"


class RunDirError(CheckpointError):
    """The run directory cannot be used (not a directory, not writable, disk full, in use)."""


def free_space(path: Path) -> str:
    """How much room is left on the disk holding ``path`` (its nearest existing ancestor), e.g. ``"312.0 MiB"``."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "unknown space"
    return f"{free / 2**30:.1f} GiB" if free >= 2**30 else f"{free / 2**20:.1f} MiB"


def disk_error(err: OSError, path: Path, doing: str) -> RunDirError:
    """A :class:`RunDirError` for an ``OSError`` raised while ``doing`` something in run directory ``path``."""
    where = err.filename or path
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return RunDirError(f"cannot {doing}: no space left on the disk holding {where} ({free_space(Path(where))} "
                           f"free; nothing saved before was changed); free some space, or pass another --run-dir "
                           f"on a disk with room")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RunDirError(f"cannot {doing}: {where} is not writable ({err.strerror}); pass a writable "
                           f"--run-dir, or fix the directory's permissions")
    if err.errno in (errno.ENOTDIR, errno.EEXIST) or (path.exists() and not path.is_dir()):
        return RunDirError(f"cannot {doing}: run directory {path} is a file, not a directory; pass another "
                           f"--run-dir, or move the file away")
    place = str(path) if "run directory" in doing else f"in run directory {path}"  # not "the run directory in ..."
    return RunDirError(f"cannot {doing} {place}: {err.strerror or err} ({free_space(path)} free "
                       f"on its disk; nothing saved before was changed); pass another --run-dir")


@contextlib.contextmanager
def writing(path: Path, doing: str) -> Iterator[None]:
    """Turn a failed write inside the block (an ``OSError``, or another library's error around one:
    :func:`os_error_of`) into a :class:`RunDirError` about run directory ``path``; anything else passes."""
    try:
        yield
    except Exception as err:
        cause = os_error_of(err)
        if cause is None:
            raise
        raise disk_error(cause, Path(path), doing) from None


# The writers a checkpoint goes through do not all raise an OSError when the disk is full: safetensors raises its
# SafetensorError ("I/O error: No space left on device (os error 28)"), torch.save's zip writer a RuntimeError that
# has lost the errno ("[enforce fail at inline_container.cc] unexpected pos ..."), torch.distributed.checkpoint a
# CheckpointException holding each rank's error. Each showed a traceback where the user needs one line.
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")
_TORCH_FILE_WRITER = ("PytorchStreamWriter", "inline_container.cc")


def os_error_of(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err``: itself, one in its chain (``__cause__``, ``__context__``, a
    ``CheckpointException``'s per-rank ``failures``), one its message gives the code of (``(os error 28)``), or an
    ``EIO`` for torch's file writer, which keeps no code; ``None`` when ``err`` is not a failed write."""
    pending, seen = [err], set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        message = str(error)
        code = _OS_ERROR_CODE.search(message)
        if code:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        if isinstance(error, RuntimeError) and any(mark in message for mark in _TORCH_FILE_WRITER):
            return OSError(errno.EIO, f"torch's file writer failed ({message.splitlines()[0].strip()})")
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            pending += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        pending += [error.__cause__, error.__context__]
    return None


def make_run_dir(path: Path) -> None:
    """Create run directory ``path`` (and its parents), or raise a :class:`RunDirError` saying why not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run directory {path} is a file, not a directory; pass another --run-dir, "
                          f"or move the file away")
    with writing(path, "create the run directory"):
        path.mkdir(parents=True, exist_ok=True)


def _holder(fd: int) -> dict:
    """What the holder of a lock file wrote in it ({} when unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        obj = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        if isinstance(obj, dict):
            return obj
    return {}


def _is_dead(holder: dict) -> bool:
    """Whether the lock's holder is a process of this host that no longer exists."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


class RunLock:
    """An exclusive lock on a run directory (see the module docstring); release it with :meth:`release`."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise a :class:`RunDirError` naming the training that holds it."""
        for _ in range(3):  # a holder that releases (unlinks) while we open gets a second try
            with writing(self.path.parent, "lock the run directory"):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if _is_dead(holder) and _same_file(fd, self.path):
                    self.path.unlink()  # held only by a leftover of a dead training: start a new lock file
                    os.close(fd)
                    continue
                os.close(fd)
                raise self._busy(holder) from None
            if _same_file(fd, self.path):
                with writing(self.path.parent, "lock the run directory"):
                    self._write_holder(fd)
                self.fd = fd
                return
            os.close(fd)  # locked a file its holder unlinked on release: lock the new one
        raise RunDirError(f"cannot lock run directory {self.path.parent}: its lock file {self.path} keeps "
                          f"changing; is another training starting there?")

    def _busy(self, holder: dict) -> RunDirError:
        who = (f"pid {holder['pid']} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
               if "pid" in holder else "another process")
        return RunDirError(f"run directory {self.path.parent} is in use by another training ({who}); wait for "
                           f"it to finish or stop it, or pass another --run-dir")

    @staticmethod
    def _write_holder(fd: int) -> None:
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)

    def release(self) -> None:
        """Remove the lock file and release the lock (unlinking first: a waiting opener then retries)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(self.fd, self.path):
                self.path.unlink()
        os.close(self.fd)
        self.fd = None


def wait_until_free(run_dir: Path, timeout_s: float, on_wait=None, poll_s: float = 0.5) -> None:
    """Return once no training holds the lock of ``run_dir``, calling ``on_wait(message)`` once if one does; raise
    the :class:`RunDirError` naming the holder after ``timeout_s`` seconds. For a process that starts a training
    in a directory an earlier one may still be leaving (a stopped child saving its checkpoint)."""
    lock, deadline, told = RunLock(run_dir), time.monotonic() + timeout_s, False
    while lock.path.exists():  # no lock file: no training has the directory
        try:
            lock.acquire()
        except RunDirError as busy:
            if time.monotonic() >= deadline:
                raise
            if not told and on_wait is not None:
                on_wait(f"{busy}: waiting up to {timeout_s:.0f} s")
                told = True
            time.sleep(poll_s)
            continue
        lock.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def hold_run_dir(run_dir: Path, dist_info) -> Iterator[None]:
    """Create ``run_dir`` and hold its lock for the block (rank 0 only); every worker raises the
    same :class:`RunDirError` when the directory cannot be used."""
    lock = RunLock(run_dir)
    problem = None
    created = not Path(run_dir).exists()
    if dist_info.is_main:
        try:
            make_run_dir(run_dir)
            lock.acquire()
        except RunDirError as err:
            problem = str(err)
    problems = dist_info.all_gather_object(problem)
    try:
        if problems[0] is not None:
            raise RunDirError(problems[0])
        yield
    finally:
        lock.release()
        if created and dist_info.is_main:
            with contextlib.suppress(OSError):
                Path(run_dir).rmdir()  # a run that failed before writing anything leaves no empty directory
