"""Where a training starts: a fresh run refuses a run directory that already holds checkpoints, a resumed one
finds the checkpoint it continues from. Shared by language-model training (loop.py) and classification
(classify.py)."""

from __future__ import annotations

from pathlib import Path

from transformer_vq.config import ConfigError
from transformer_vq.train.checkpoint import Checkpoint, find_checkpoint, latest_checkpoint, list_checkpoints


def refuse_fresh_over_checkpoints(ckpt_root: Path, run_dir: Path, resume: str | None) -> None:
    """A new run (``resume`` None) must not write over another run's checkpoints: raise :class:`ConfigError`."""
    if resume is None and list_checkpoints(ckpt_root):
        raise ConfigError(
            f"run directory {run_dir} already holds checkpoints; continue that run with --resume auto, "
            f"or start a new one with another --run-dir (or --name)"
        )


def checkpoint_to_resume(ckpt_root: Path, resume: str, log) -> Checkpoint | None:
    """The checkpoint ``resume`` names: for ``"auto"`` the newest complete one under ``ckpt_root`` (None, logged,
    when there is none yet), else the run or checkpoint directory at that path."""
    if resume != "auto":
        return find_checkpoint(resume)
    ckpt = latest_checkpoint(ckpt_root, log=log)
    if ckpt is None:
        log(f"no checkpoint in {ckpt_root} yet: starting from scratch")
    return ckpt
