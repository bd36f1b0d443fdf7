"""Which tensors are alive at the peak of one block's forward and of its forward + backward (issue 22, item 3).

    python benchmarks/longvq_block_memory.py [--lengths 4096 16384] [--kinds longvq transformer] --out DIR --name NAME

The RSS figures of ``tvq bench longvq`` say how high a block's memory rises, not what fills it. Here every tensor an
operator returns during the call is followed (a ``TorchDispatchMode``; its storage is dropped from the count when
the storage is freed, views of it count once), so the running sum of live storages has a peak, and at that peak the
live tensors are listed by where they were made: the line of this project that called the op (or ``backward`` for
the autograd engine's own ops) and the op. Inputs, weights and tensors made before the call are not counted; nor are
an op's internal buffers that never leave it (an FFT's work space): the RSS rise of the timing benchmarks includes
those, this count does not.

Per length and block kind (widths of ``tvq bench longvq``'s ``--preset``, default ``lra-text``; B = 1, fp32), after
one warm-up call: ``forward`` (eval, no gradients) and ``fwd+bwd`` (train; gradients of the weights and the input,
the commitment loss included), as benchmarks/longvq_block_profile.py runs them. Writes ``NAME.json`` and ``NAME.md``.
Another revision's package: extract it (``git archive REV transformer_vq | tar -x -C DIR``) and run with
``PYTHONPATH=DIR`` and ``--revision REV``.
"""

from __future__ import annotations

import argparse
import linecache
import re
import sys
import time
import traceback
import weakref
from collections import defaultdict
from pathlib import Path

import torch
from longvq_block_profile import passes
from result_files import write_result
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import transformer_vq
from transformer_vq.bench.config import LONGVQ_BENCH_PRESETS, LongVQBenchConfig
from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import file_stem, int_at_least, not_empty

# the package measured, whose lines name the sites: this checkout, or another revision put first on PYTHONPATH
PACKAGE = str(Path(transformer_vq.__file__).resolve().parent)


FRAME = re.compile(r'File "([^"]+)", line (\d+)')
CHECKS = {"isnan", "_is_any_true", "_local_scalar_dense"}  # anomaly mode's own checks, neither counted nor timed


def project_frame(frames) -> str | None:
    """``file.py:line`` of the innermost of ``frames`` (``(filename, line)`` pairs, outermost first) in the package."""
    for filename, line in reversed(list(frames)):
        if filename.startswith(PACKAGE):
            return f"{Path(filename).relative_to(PACKAGE)}:{line}"
    return None


def call_site() -> str:
    """Where the running op comes from: ``file.py:line`` of the innermost frame of this project's package; in the
    backward pass ``bwd file.py:line`` of the forward op whose gradient it computes (the autograd node's traceback,
    kept by anomaly mode), or ``backward`` where there is none (the engine's own sums)."""
    node = torch._C._current_autograd_node()
    if node is None:
        return project_frame((f.filename, f.lineno) for f in traceback.extract_stack()[:-3]) or "outside"
    trace = node.metadata.get("traceback_") or []
    site = project_frame((f, int(n)) for f, n in FRAME.findall("".join(trace)))
    return f"bwd {site}" if site else "backward"


class LiveTensors(TorchDispatchMode):
    """The bytes of the storages made inside the mode and still alive, their peak, and who held them then."""

    def __init__(self):
        super().__init__()
        self.live = {}  # storage address -> (bytes, site, op, shape)
        self.now = self.peak = 0
        self.at_peak: list[tuple] = []
        self.seconds = defaultdict(float)  # site -> seconds in ops called there

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key)[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in CHECKS:
            return func(*args, **(kwargs or {}))
        site = call_site()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds[site] += time.perf_counter() - start
        grew = False
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self.live:
                continue
            self.live[key] = (size, site, func.overloadpacket.__name__, tuple(t.shape))
            weakref.finalize(storage, self._free, key)
            self.now += size
            grew = True
        if grew and self.now > self.peak:
            self.peak, self.at_peak = self.now, list(self.live.values())
        return out


def source(site: str) -> str:
    """The code at ``site`` (``[bwd ]file.py:line``), shortened."""
    path, _, line = site.removeprefix("bwd ").rpartition(":")
    text = linecache.getline(str(Path(PACKAGE) / path), int(line)).strip() if line.isdigit() else ""
    return text if len(text) <= 70 else text[:67] + "..."


def measure(call) -> dict:
    """Peak live bytes of ``call()`` and the live tensors then, grouped by (site, op, shape), largest first; and the
    seconds of its ops by site (anomaly mode keeps each autograd node's forward traceback, to name a backward op's
    site: it adds checks of its own, which are left out of both)."""
    with torch.autograd.set_detect_anomaly(True, check_nan=False), LiveTensors() as mode:
        call()
    groups = defaultdict(lambda: [0, 0])
    for size, site, op, shape in mode.at_peak:
        groups[site, op, shape][0] += size
        groups[site, op, shape][1] += 1
    rows = sorted(({"site": s, "op": o, "shape": list(sh), "bytes": b, "count": n}
                   for (s, o, sh), (b, n) in groups.items()), key=lambda r: -r["bytes"])
    total = sum(mode.seconds.values())
    times = sorted(({"site": k, "seconds": v} for k, v in mode.seconds.items()), key=lambda r: -r["seconds"])
    return {"peak_bytes": mode.peak, "at_peak": rows, "op_seconds": total, "time_by_site": times}


def table(cell: dict, top: int) -> str:
    mib = 2 ** 20
    lines = [f"### {cell['kind']}, T = {cell['T']}, {cell['pass']}: peak {cell['peak_bytes'] / mib:.1f} MiB live, "
             f"{cell['op_seconds'] * 1e3:.0f} ms in ops", "", "Time by site:", "",
             "| ms | share | site | code |", "|---:|---:|---|---|"]
    for row in cell["time_by_site"][:top]:
        lines.append(f"| {row['seconds'] * 1e3:.1f} | {row['seconds'] / cell['op_seconds']:.0%} | {row['site']} | "
                     f"`{source(row['site'])}` |")
    lines += ["", "Alive at the memory peak:", "", "| MiB | share | tensors | made at | op | shape |",
              "|---:|---:|---:|---|---|---|"]
    for row in cell["at_peak"][:top]:
        lines.append(f"| {row['bytes'] / mib:.1f} | {row['bytes'] / cell['peak_bytes']:.0%} | {row['count']} | "
                     f"{row['site']} | {row['op']} | {row['shape']} |")
    rest = sum(r["bytes"] for r in cell["at_peak"][top:])
    if rest:
        lines.append(f"| {rest / mib:.1f} | {rest / cell['peak_bytes']:.0%} | | the {len(cell['at_peak']) - top} "
                     f"smaller groups | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--name", type=file_stem, required=True)
    parser.add_argument("--lengths", type=int_at_least(1), nargs="+", default=[4096, 16384])
    parser.add_argument("--preset", default="lra-text", choices=sorted(LONGVQ_BENCH_PRESETS))
    parser.add_argument("--kinds", nargs="+", default=["longvq", "transformer"], choices=["longvq", "transformer"])
    parser.add_argument("--revision", type=not_empty,
                        help="the revision of the package on PYTHONPATH, when it is not this checkout")
    parser.add_argument("--top", type=int_at_least(1), default=14, help="groups of tensors listed per cell")
    args = parser.parse_args(argv)
    cfg = LongVQBenchConfig(model=LONGVQ_BENCH_PRESETS[args.preset], isolate=False)
    cells = []
    with OthersLoad() as load:
        for length in args.lengths:
            for kind in args.kinds:
                for name, call in passes(kind, cfg, length).items():
                    call()  # warm-up
                    cells.append({"kind": kind, "T": length, "pass": name, **measure(call)})
                    print(f"{kind} T={length} {name}: {cells[-1]['peak_bytes'] / 2 ** 20:.1f} MiB", flush=True)
    summary = load.summary()
    m = machine_info(measure_peak=False)
    record = {"machine": m, "package": PACKAGE, "revision": args.revision, "model": cfg.model.__dict__,
              "batch_size": cfg.batch_size, "others_load": summary,
              "cells": cells, "command": command_line()}
    measured = args.revision or f"this checkout at {m.get('commit')} (dirty: {m.get('dirty')})"
    head = (f"# One block's live tensors at its memory peak\n\n`{record['command']}`; package measured: {measured}, "
            f"torch {m['torch']}; widths {args.preset}: {cfg.model}; B = "
            f"{cfg.batch_size}, fp32. {load_text(summary)} (memory does not depend on it).\n\n"
            "Bytes of the storages returned by operators during the call and alive at its peak (inputs and weights "
            "excluded, an op's internal work space too), grouped by the line that made them (`backward`: the autograd "
            "engine) and op.\n\n| kind | T | pass | peak live MiB |\n|---|---:|---|---:|\n")
    head += "".join(f"| {c['kind']} | {c['T']} | {c['pass']} | {c['peak_bytes'] / 2 ** 20:.1f} |\n" for c in cells)
    write_result(record, head + "\n" + "\n".join(table(c, args.top) for c in cells), args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
