"""A torchrun worker for ``test_torchrun_messages.py``: 2 workers join their groups through ``setup_distributed``
with a 2-second collective timeout and context parallelism 2 (the default group and the mesh's "cp" group); rank 1
stalls (stops itself, as ``kill -STOP`` would), and rank 0 prints, for a collective on each group, how long it waited
and the line the command line shows for its error. Rank 0 then ends the stalled rank, which a SIGTERM cannot."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from transformer_vq.cli.errors import describe
from transformer_vq.train.parallel.distributed import setup_distributed

info = setup_distributed("cpu", "ddp", context_parallel=2, timeout=2.0)
pids = info.all_gather_object(os.getpid())
if info.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
for name, group in (("default", None), ("cp", info.cp_group)):
    begin = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=group)
        print(f"{name}: no timeout")
    except RuntimeError as err:
        waited = time.monotonic() - begin  # not to the second: the machine may be loaded
        print(f"{name}: waited {'2' if 1.9 <= waited < 20 else f'{waited:.1f}'} s; {describe(err)}", flush=True)
os.kill(pids[1], signal.SIGKILL)
sys.stdout.flush()
os._exit(0)  # the group's peer is gone: no teardown
