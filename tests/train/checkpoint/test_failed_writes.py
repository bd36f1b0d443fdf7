"""A checkpoint write that fails inside another library's writer is the run directory's one-line error, as an
``OSError`` is: safetensors and torch.save wrap (or lose) the errno of a full disk, torch.distributed.checkpoint
gathers each rank's error. The writers are the real ones, failing for real: a subprocess under a file-size limit
(``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored the write returns ``EFBIG``), which needs no full disk to mount."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transformer_vq.train.checkpoint.rundir import disk_error, os_error_of

SAVE = textwrap.dedent("""
    import resource, signal, sys, torch
    from pathlib import Path
    from transformer_vq import TransformerVQ, preset
    from transformer_vq.train.checkpoint import save_checkpoint
    from transformer_vq.train.checkpoint.rundir import RunDirError, writing

    root, limit = Path(sys.argv[1]), int(sys.argv[2])
    model = TransformerVQ(preset("tiny", n_layers=1))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        with writing(root, "save checkpoint step_00000001"):
            save_checkpoint(root / "checkpoints", step=1, model=model, config={}, keep=1,
                            state={"optimizer": torch.zeros(200_000)})
    except RunDirError as err:
        print("RunDirError:", err)
""")


def _weights_size(tmp_path) -> int:
    from safetensors.torch import save_model

    from transformer_vq import TransformerVQ, preset

    save_model(TransformerVQ(preset("tiny", n_layers=1)), str(tmp_path / "w.safetensors"))
    return (tmp_path / "w.safetensors").stat().st_size


@pytest.mark.parametrize("failing", ["safetensors", "torch.save"])
def test_a_write_failing_inside_the_real_writers_is_one_line_and_leaves_nothing(tmp_path, failing):
    limit = 1024 if failing == "safetensors" else _weights_size(tmp_path) + 4096  # the weights fit, state.pt not
    root = tmp_path / "run"
    root.mkdir()
    done = subprocess.run([sys.executable, "-c", SAVE, str(root), str(limit)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    said = {"safetensors": "File too large", "torch.save": "torch's file writer failed"}[failing]
    assert done.stdout.startswith(f"RunDirError: cannot save checkpoint step_00000001 in run directory {root}: {said}")
    assert "Traceback" not in done.stdout + done.stderr
    assert not (root / "checkpoints").exists() or not any((root / "checkpoints").glob("step_*"))


def test_the_os_error_is_found_however_a_writer_wraps_it():
    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(errno.ENOSPC, "No space left on device")
    gathered = CheckpointException("save failed", {0: (RuntimeError("rank 0 failed"), None), 1: (full, None)})
    assert os_error_of(gathered) is full
    assert os_error_of(ValueError("Error while serializing: I/O error: No space left on device (os error 28)")).errno \
        == errno.ENOSPC
    lost = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 151680 vs 151572")
    assert os_error_of(lost).errno == errno.EIO
    chained = RuntimeError("wrapper")
    chained.__cause__ = full
    assert os_error_of(chained) is full
    assert os_error_of(RuntimeError("a bug, not a write")) is None and os_error_of(KeyError("x")) is None
    assert "no space left on the disk" in str(disk_error(os_error_of(gathered), Path("."), "save"))
