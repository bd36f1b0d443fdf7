"""Checkpoints and run directories: everything about their layout on disk, in one place.

``store.py`` writes and reads a checkpoint atomically and verified (the layout of ``RUN_DIR/checkpoints/``);
``dcp.py`` is the sharded format of FSDP runs; ``resume.py`` says where a training starts; ``rundir.py`` is the run
directory's lock and its errors; ``errors.py`` the leaf they share. The package never imports the parallelism
(``train/parallel``): what a sharded save needs from the workers, the trainer passes in.
"""

from transformer_vq.train.checkpoint.errors import CheckpointError
from transformer_vq.train.checkpoint.resume import check_resume
from transformer_vq.train.checkpoint.rundir import RunDirError
from transformer_vq.train.checkpoint.store import (BEST_DIR, CHECKPOINTS_DIR, STEP_DIR, Checkpoint, check_architecture,
                                                   find_checkpoint, latest_checkpoint, list_checkpoints,
                                                   read_checkpoint, run_dir_of, save_checkpoint,
                                                   save_sharded_checkpoint, step_name)

__all__ = [
    "BEST_DIR", "CHECKPOINTS_DIR", "STEP_DIR", "Checkpoint", "CheckpointError", "RunDirError", "check_architecture",
    "check_resume", "find_checkpoint", "latest_checkpoint", "list_checkpoints", "read_checkpoint", "run_dir_of",
    "save_checkpoint", "save_sharded_checkpoint", "step_name",
]
