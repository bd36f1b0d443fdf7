"""The exit status of a batch command (``tvq bench *``, ``tvq ablate``): one rule for every command that runs many
cells and goes on past a failed one.

0 only when every requested cell succeeded or was skipped as asked (a benchmark cell over ``--budget-s``); otherwise
1, after one line per failed cell saying which and why, on stderr, so that a script or CI job never takes a run
where every cell failed for a success.
"""

from __future__ import annotations

import sys


def batch_status(failed: list[tuple[str, str]], total: int, *, what: str, retry: str) -> int:
    """Print the failed cells (``(cell, why)`` pairs) of ``total`` ``what`` and ``retry`` (what to do next) to stderr
    and return 1; return 0 when none failed."""
    if not failed:
        return 0
    lines = [f"error: {len(failed)} of {total} {what} failed:"] + [f"  {cell}: {why}" for cell, why in failed]
    print("\n".join(lines + [retry]), file=sys.stderr, flush=True)
    return 1
