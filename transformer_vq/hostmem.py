"""Host memory for long sequences on a CPU: keep freed blocks in the heap for the next step instead of returning them
to the operating system.

glibc's ``malloc`` serves a block larger than its mmap threshold (which it raises as blocks are freed, up to 32 MiB)
with a fresh mapping and unmaps it again on ``free``. A training step at 32k tokens allocates and frees dozens of
blocks larger than that: one ``[T, Dv]`` float32 activation at 32k x 512 is 64 MiB. The kernel then page-faults and
zeroes every page of every such tensor again in every step, and the elementwise passes, which touch each byte once,
run 2-4 times slower per token than at 8k, where the tensors stay in the heap. Measured on a 2-core CPU with
``tvq bench train`` (docs/benchmarks.md): tokens per second at 32k / 8k went from 0.65 to 1.13 with the memory
retained, and 131k / 8k from 0.57 to 0.84.

:func:`retain_freed_memory` turns glibc's large-block mappings and heap trimming off for this process: every block comes
from the heap and a freed one stays there for reuse, however large the free top of the heap grows (a trim threshold of 2
GiB, the largest positive ``int``, still gave a 131k-token step's 6 GiB back after every step). The price is memory: the
process keeps its peak heap until it exits, and glibc lets the heap grow by a few blocks before it reuses freed ones (a
64-byte-aligned request is a little larger than the block that was freed). At 32k tokens a training step of the
benchmark's model peaked at 3.2 GiB instead of 2.3 GiB, for 1.67x the tokens per second. Elsewhere than glibc (macOS,
musl) it changes nothing.

:func:`meminfo_bytes` reads the machine's memory (total, available) for the benchmark reports and for the refusal of a
model too large to build (:func:`transformer_vq.train.models.check_fits`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from pathlib import Path

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# mallopt takes an int, which glibc stores as a size_t: -1 is the largest threshold, never reached. The largest positive
# int, 2 GiB, was used before and trimmed the heap whenever its free top exceeded 2 GiB: a 131k-token step of the
# benchmark's model (11 GiB peak) gave 6 GiB back to the kernel and page-faulted it in again in the next step
# (docs/benchmarks.md, "Training memory at scale").
_NEVER_TRIM = -1

_retained = False


def retain_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed memory for reuse (glibc only; see the module docstring).

    Returns True when the setting is in effect (now or from an earlier call), False where the C library is not glibc
    or refused it (nothing changed then). Idempotent; it cannot be undone for the process.
    """
    global _retained
    if _retained:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success, 0 on error
    _retained = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
    return _retained


def meminfo_bytes(key: str) -> int | None:
    """A ``/proc/meminfo`` figure in bytes (``"MemTotal"``, ``"MemAvailable"``); None where there is none (not
    Linux, or not readable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None
