"""Run one benchmark cell in a fresh Python process: its own peak memory, and out-of-memory reported, not a crash.

A cell is a function ``module:function`` taking JSON-ready keyword arguments and returning a JSON-ready dict. Every
cell's result carries its peak memory (:class:`transformer_vq.bench.memory.PeakMemory`: the process's RSS high-water
mark over the cell, and how far it rose above the RSS the cell started from; on CUDA the allocator's peak). In a
child process nothing of an earlier cell is in the heap, an address-space limit turns running out of memory into an
ordinary failed allocation (the machine may be shared, so a cell must not take it down), and a wall-clock timeout
bounds a cell that is slower than estimated.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys

from transformer_vq.bench.memory import PeakMemory
from transformer_vq.hostmem import retain_freed_memory

_OOM_WORDS = ("can't allocate memory", "out of memory", "not enough memory", "memoryerror", "bad_alloc")


def _load(target: str):
    """The function ``module:function`` names (its imports are not part of the cell)."""
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def _call(function, kwargs: dict, device: str) -> dict:
    """``function(**kwargs)``'s result with the cell's peak memory on ``device``."""
    with PeakMemory(device) as peak:
        result = function(**kwargs)
    return {**result, **peak.figures()}


def _shared_heap(row: dict) -> dict:
    """A CPU cell run in this process, without its memory: it reuses the heap the cells before it left (kept for
    reuse, or not yet returned), so its RSS rise measures them as much as it, and a ratio of two such rises is noise
    (a CUDA cell's allocator peak is reset per cell, and kept)."""
    return {key: _shared_heap(value) if isinstance(value, dict) else value for key, value in row.items()
            if "rss" not in key}


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or any(w in str(error).lower() for w in _OOM_WORDS)


def _failure(error: BaseException) -> dict:
    """A failed cell's row: out of memory or another error, with the error's message."""
    return {"status": "oom" if _is_oom(error) else "error", "error": f"{type(error).__name__}: {error}"[:300]}


def _start_failure(error: BaseException, limit: int) -> dict:
    """A cell whose process could not import its code: under an address-space limit that is the limit being too
    small for torch's libraries to even map (``failed to map segment``), not the cell running out of memory."""
    if not (_is_oom(error) or "map segment" in str(error)):
        return _failure(error)
    return _too_small(limit, f"importing its code failed: {type(error).__name__}: {str(error)[:120]}")


def _too_small(limit: int, why: str) -> dict:
    return {"status": "error", "error": f"--mem-limit-gib {limit / 2**30:g} is too small for a cell's process to even "
                                        f"start ({why}); raise --mem-limit-gib, or give 0 for no limit"}


def _child() -> None:
    """Entry point of the child: read ``{target, kwargs, device, mem_limit_bytes, retain_memory}`` on stdin, print
    the result as JSON."""
    request = json.loads(sys.stdin.read())
    limit = request.get("mem_limit_bytes")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if request.get("retain_memory"):
        retain_freed_memory()
    try:
        function = _load(request["target"])
    except Exception as error:  # noqa: BLE001 - reported in the cell's row
        result = _start_failure(error, limit) if limit else _failure(error)
    else:
        try:
            result = _call(function, request["kwargs"], request["device"])
        except Exception as error:  # noqa: BLE001 - any failure of a cell is reported in its row
            result = _failure(error)
    print("\n@@RESULT@@" + json.dumps(result))


def budget_plan(row: dict, est_fwd: float | None, est_bwd: float | None, budget_s: float,
                backward: bool) -> bool | None:
    """Whether a cell estimated at ``est_fwd`` / ``est_bwd`` seconds (None: not known yet) times its backward pass
    (False when only the backward is over ``budget_s``, with its estimate in ``row``), or None: the whole cell is over
    budget and ``row`` is marked skipped with its estimates."""
    if est_fwd is not None and est_fwd > budget_s:
        row.update(status="skipped", estimated_forward_s=round(est_fwd, 1),
                   estimated_fwd_bwd_s=round(est_bwd, 1) if backward else None)
        return None
    if backward and est_bwd is not None and est_bwd > budget_s:
        row["estimated_fwd_bwd_s"] = round(est_bwd, 1)
        return False
    return backward


def host_options(cfg) -> dict:
    """Where a benchmark's cells run and how they treat host memory: ``device`` (whose memory a cell's peak is),
    ``mem_limit_gib``, the address-space limit of a cell's process (None: none), and ``retain_memory``, whether freed
    memory is kept for reuse as ``tvq train`` keeps it (:mod:`transformer_vq.hostmem`).

    No address-space limit on a GPU: the CUDA driver reserves far more address space than the machine has memory when
    it starts, so any such limit stops it (the GPU's own memory running out is reported as ``oom`` all the same)."""
    device = getattr(cfg, "device", "cpu")
    on_cpu = device == "cpu"
    return {"device": device, "mem_limit_gib": (cfg.mem_limit_gib or None) if on_cpu else None,
            "retain_memory": on_cpu and cfg.retain_host_memory}


def run_cell(target: str, kwargs: dict, *, isolate: bool = True, timeout_s: float | None = None, device: str = "cpu",
             mem_limit_gib: float | None = None, retain_memory: bool = False) -> dict:
    """Run ``target(**kwargs)``, in a child process when ``isolate``, with its peak memory on ``device``.

    ``retain_memory``: keep freed host memory for reuse in the process that runs the cell
    (:mod:`transformer_vq.hostmem`; this process when not isolated). A cell that fails reports ``status`` "oom",
    "timeout" or "error" with a message instead of raising.
    """
    load = {"load_average_1min": round(os.getloadavg()[0], 2)}  # how busy the (possibly shared) CPU was
    return {**load, **_run(target, kwargs, isolate, timeout_s, device, mem_limit_gib, retain_memory)}


def _run(target, kwargs, isolate, timeout_s, device, mem_limit_gib, retain_memory) -> dict:
    if not isolate:
        if retain_memory:
            retain_freed_memory()
        try:
            row = _call(_load(target), kwargs, device)
        except Exception as error:  # noqa: BLE001
            return _failure(error)
        return _shared_heap(row) if device == "cpu" else row
    request = {"target": target, "kwargs": kwargs, "device": device, "retain_memory": retain_memory,
               "mem_limit_bytes": int(mem_limit_gib * 2**30) if mem_limit_gib else None}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from transformer_vq.bench.isolate import _child; _child()"],
            input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"ran longer than {timeout_s:.0f} s"}
    if "@@RESULT@@" in proc.stdout:
        return json.loads(proc.stdout.rsplit("@@RESULT@@", 1)[1])
    if proc.returncode < 0:  # killed by a signal: the kernel's OOM killer sends SIGKILL
        return {"status": "oom", "error": f"killed by signal {-proc.returncode}"}
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    if request["mem_limit_bytes"] and ("MemoryError" in last or "map segment" in last):
        # under a limit so small that the child died before it could catch anything (Python's own start-up)
        return _too_small(request["mem_limit_bytes"], f"it ended with {last[:120]}")
    return {"status": "error", "error": last}
