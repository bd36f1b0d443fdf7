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
