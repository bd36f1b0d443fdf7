"""Where one LongVQ block's time and bytes go, op by op, beside one full-attention block (issue 22, item 3).

For each length ``T`` and block kind (``longvq``: :class:`~transformer_vq.models.longvq.layer.LongVQBlock` as an
encoder; ``transformer``: the SDPA baseline,
:class:`~transformer_vq.models.baselines.classifiers.TransformerEncoderLayer`)
it runs ``torch.profiler`` over the forward pass (eval, no gradients) and over the forward + backward pass (train,
gradients of the weights and the input, the commitment loss included), after warm-up calls, at the widths of
``tvq bench longvq`` (default: its ``lra-text`` preset). Each table lists the ops by self CPU time with their self
CPU memory (bytes allocated by the op itself; negative: freed), so the backward of each op appears as its autograd
node (``MmBackward0``, ...) and its kernels.

Writes ``OUT.json`` (top ops per cell) and ``OUT.md`` (the tables) with the machine, commit, versions and the
others' load::

    python benchmarks/longvq_block_profile.py --lengths 4096 16384 --out benchmarks/results/longvq-block-profile-DATE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_vq.bench.config import LONGVQ_BENCH_PRESETS
from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.longvq import _apply, build_layer
from transformer_vq.bench.config import LongVQBenchConfig
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty


def passes(kind: str, cfg: LongVQBenchConfig, length: int) -> dict:
    """``{"forward": call, "fwd+bwd": call}`` of one block of ``kind`` on random embeddings of ``length`` tokens."""
    layer = build_layer(kind, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.batch_size, length, cfg.model.d_model, generator=gen)
    mask = torch.ones(cfg.batch_size, length, dtype=torch.bool)
    cotangent = torch.randn(x.shape, generator=gen)
    autocast = torch.autocast("cpu", enabled=False)

    def forward():
        layer.eval()
        with torch.no_grad():
            _apply(layer, x, mask, autocast)

    def fwd_bwd():
        layer.train()
        layer.zero_grad(set_to_none=True)
        inp = x.detach().requires_grad_()
        y, commit = _apply(layer, inp, mask, autocast)
        ((y * cotangent).sum() + (0 if commit is None else commit)).backward()

    return {"forward": forward, "fwd+bwd": fwd_bwd}


def profile_call(call, warmup: int) -> tuple[list[dict], str, float]:
    """``(top ops, table text, total ms)`` of one profiled call after ``warmup`` unprofiled ones."""
    for _ in range(warmup):
        call()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events = prof.key_averages()
    rows = sorted(({"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "cpu_total_ms": e.cpu_time_total / 1e3,
                    "calls": e.count, "self_cpu_memory_mb": e.self_cpu_memory_usage / 2 ** 20} for e in events),
                  key=lambda r: -r["self_cpu_ms"])
    total = sum(r["self_cpu_ms"] for r in rows)
    return rows, events.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=48), total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=not_empty, required=True, help="output path without extension")
    parser.add_argument("--lengths", type=int_at_least(1), nargs="+", default=[4096, 16384])
    parser.add_argument("--preset", default="lra-text", choices=sorted(LONGVQ_BENCH_PRESETS))
    parser.add_argument("--kinds", nargs="+", default=["longvq", "transformer"], choices=["longvq", "transformer"])
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="unprofiled calls first (0 = none)")
    parser.add_argument("--top", type=int_at_least(1), default=15, help="ops kept per cell in the JSON")
    args = parser.parse_args(argv)
    cfg = LongVQBenchConfig(model=LONGVQ_BENCH_PRESETS[args.preset], isolate=False)
    cells, sections = [], []
    with OthersLoad() as load:
        for length in args.lengths:
            for kind in args.kinds:
                for name, call in passes(kind, cfg, length).items():
                    rows, table, total = profile_call(call, args.warmup)
                    cells.append({"kind": kind, "T": length, "pass": name, "self_cpu_total_ms": total,
                                  "top": rows[:args.top]})
                    head = f"{kind}, T = {length}, {name}: {total:.0f} ms of self CPU time"
                    print(head, flush=True)
                    sections.append(f"### {head}\n\n```\n{table}\n```\n")
    summary = load.summary()
    print(load_text(summary))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine_info(measure_peak=False), "model": cfg.model.__dict__, "batch_size": cfg.batch_size,
              "others_load": summary, "cells": cells, "command": command_line()}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    m = record["machine"]
    out.with_suffix(".md").write_text(
        f"# One LongVQ block against one SDPA transformer block, op by op (torch.profiler)\n\n"
        f"`{record['command']}`; commit {m.get('commit')}, torch {m['torch']}, {m['cpu']}, "
        f"{m['torch_threads']} threads; widths {args.preset}: {cfg.model}; B = {cfg.batch_size}, fp32.\n"
        f"{load_text(summary)}. Profiler times include its own overhead (a few percent); the timings of record are "
        f"in the `longvq-lra-*` files.\n\n" + "\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
