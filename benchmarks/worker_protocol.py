"""The line protocol of the persistent benchmark workers (standard library only: both the project's environment and
the JAX environment import it).

A worker holds the compiled or built functions of each length between calls, so the controller
(benchmarks/jax_layer.py) can interleave the two implementations call by call. It reads one JSON request per line on
stdin and writes one JSON reply per line on stdout (anything else a library prints goes to stderr):

- ``{"cmd": "prepare", "T": T}``: build the functions of length ``T`` and run each once (compilation, warm-up);
  replies ``{"warmup_s": {mode: seconds}}``.
- ``{"cmd": "run", "T": T, "mode": "fwd" | "fwdbwd"}``: one timed call; replies ``{"seconds": s}``.
- ``{"cmd": "drop", "T": T}``: forget length ``T`` (its memory); ``{"cmd": "quit"}`` ends the worker.

The first line a worker writes is its ``hello`` (versions, threads). Errors reply ``{"error": text}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable

MODES = ("fwd", "fwdbwd")


def timed(fn: Callable[[], None]) -> float:
    """Wall seconds of one call of ``fn`` (which returns only when its work is done)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def serve(prepare: Callable[[int], dict], hello: dict) -> None:
    """Answer requests until ``quit`` or end of input; ``prepare(T)`` gives ``{mode: fn}`` for the modes."""
    out, sys.stdout = sys.stdout, sys.stderr  # only replies go to the controller

    def reply(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    reply(hello)
    held: dict[int, dict] = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["cmd"] == "quit":
                break
            if request["cmd"] == "prepare":
                held[request["T"]] = prepare(request["T"])
                reply({"warmup_s": {mode: timed(fn) for mode, fn in held[request["T"]].items()}})
            elif request["cmd"] == "run":
                reply({"seconds": timed(held[request["T"]][request["mode"]])})
            elif request["cmd"] == "drop":
                held.pop(request["T"], None)
                reply({"dropped": request["T"]})
            else:
                reply({"error": f"unknown command {request['cmd']!r}"})
        except Exception as error:  # reported to the controller, which stops with it
            reply({"error": f"{type(error).__name__}: {error}"})
