"""A torchrun worker for ``test_ddp.py``: ``train()`` a tiny run over DDP, recording which gloo threads the process
still has right after the process group was torn down (``teardown_distributed`` returned), while ``train`` itself
has not returned yet. Arguments: the corpus file, the run directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/train: trainutil

from trainutil import tiny_config  # noqa: E402

from transformer_vq.train.lm import trainer as lm_trainer  # noqa: E402


def thread_names() -> list[str]:
    return sorted((Path("/proc/self/task") / tid / "comm").read_text().strip() for tid in os.listdir("/proc/self/task"))


left = []
teardown = lm_trainer.teardown_distributed


def recording_teardown(info) -> None:
    teardown(info)
    left.extend(name for name in thread_names() if "gloo" in name)


lm_trainer.teardown_distributed = recording_teardown
lm_trainer.train(tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), "steps=2", "ckpt_every=100"))
print(f"rank {os.environ['RANK']}: gloo threads left after the teardown: {left}")
