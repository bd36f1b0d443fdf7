"""The line protocol of the persistent benchmark workers (standard library only: both the project's environment and
the JAX environment import it).

A worker holds the compiled or built functions of each length between calls, so the controller
(benchmarks/jax_layer.py) can interleave the two implementations call by call. It reads one JSON request per line on
stdin and writes one JSON reply per line on stdout (anything else a library prints goes to stderr):

- ``{"cmd": "prepare", "T": T}``: build the functions of length ``T`` and run each once (compilation, warm-up);
  replies ``{"warmup_s": {mode: seconds}, "warmup_peak": {mode: peak}}``.
- ``{"cmd": "run", "T": T, "mode": "fwd" | "fwdbwd"}``: one timed call; replies ``{"seconds": s, "peak": peak}``.

A ``peak`` is the worker process's memory over that call (transformer_vq/bench/memory.py, loaded by path: it is
standard library only): ``peak_rss_bytes`` (the RSS high-water mark, reset right before the call),
``peak_rss_rise_bytes`` (its rise over the RSS before the call) and ``peak_rss_source``. The peak is read after the
timer stops, so it costs the timing nothing.
- ``{"cmd": "flops", "T": T}``: the FLOPs of each mode's call (untimed); replies ``{"flops": {mode: n}}``, or an
  error from a worker that does not count them.
- ``{"cmd": "drop", "T": T}``: forget length ``T`` (its memory); ``{"cmd": "quit"}`` ends the worker.

The first line a worker writes is its ``hello`` (versions, threads). Errors reply ``{"error": text}``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Callable

MODES = ("fwd", "fwdbwd")


def _load_memory():
    """transformer_vq/bench/memory.py as a module of its own: the JAX environment has no ``transformer_vq`` of ours
    (and the authors' package has that name)."""
    path = Path(__file__).resolve().parents[1] / "transformer_vq" / "bench" / "memory.py"
    spec = importlib.util.spec_from_file_location("tvq_bench_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PeakMemory = _load_memory().PeakMemory


def timed(fn: Callable[[], None]) -> tuple[float, dict]:
    """Wall seconds of one call of ``fn`` (which returns only when its work is done) and the process's peak memory
    over it."""
    with PeakMemory() as peak:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    return seconds, peak.figures()


def serve(prepare: Callable[[int], dict], hello: dict, count: Callable[[Callable], int] | None = None) -> None:
    """Answer requests until ``quit`` or end of input; ``prepare(T)`` gives ``{mode: fn}`` for the modes, ``count(fn)``
    the FLOPs of one call of ``fn`` (``None``: this worker does not count)."""
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
                warm = {mode: timed(fn) for mode, fn in held[request["T"]].items()}
                reply({"warmup_s": {mode: w[0] for mode, w in warm.items()},
                       "warmup_peak": {mode: w[1] for mode, w in warm.items()}})
            elif request["cmd"] == "run":
                seconds, peak = timed(held[request["T"]][request["mode"]])
                reply({"seconds": seconds, "peak": peak})
            elif request["cmd"] == "flops":
                if count is None:
                    raise ValueError("this worker does not count FLOPs")
                reply({"flops": {mode: count(fn) for mode, fn in held[request["T"]].items()}})
            elif request["cmd"] == "drop":
                held.pop(request["T"], None)
                reply({"dropped": request["T"]})
            else:
                reply({"error": f"unknown command {request['cmd']!r}"})
        except Exception as error:  # reported to the controller, which stops with it
            reply({"error": f"{type(error).__name__}: {error}"})
