"""``tvq bench train``: tokens/s of a whole training step for each attention type and head type (paper Table 6).

A step is what training does per window: forward with the loss, backward, one AdamW step and, for VQ models, the
codebook EMA update. Every (model, T) cell runs in its own process (``transformer_vq.bench.isolate``) so a model that
runs out of memory is reported as ``OOM`` and the benchmark goes on; a cell whose time, extrapolated from the same model
at the previous length (linearly for ``vq`` and ``flash``, quadratically for ``full`` and ``flash_quad``), exceeds the
budget is reported as skipped with its estimate.

Each cell reports its peak memory (:mod:`transformer_vq.bench.memory`): the process's peak RSS over its steps and
how far a step raised it; in the interleaved mode each (model, T)'s peak is taken over its own steps only. Each also
reports the others' load while its steps ran (:mod:`transformer_vq.bench.load`). A model measured at two lengths or more
gets its scaling (:func:`scaling`): the least-squares slope of peak memory against T (GiB per 1,024 tokens) with the
largest residual, and the fastest over the slowest tokens/s; linear training memory and flat tokens/s are what the
linear operator promises.

A step reads the whole sequence of T tokens in one call, with backpropagation through all of it: the memory of a step
is the memory of training on a T-token sequence (``tvq train`` instead splits a sequence into windows of
``--update-len`` with the state carried, which bounds its memory by the window).

Defaults are a small model so that the whole benchmark takes minutes on a CPU; pass the paper's sizes to compare with
Table 6.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict

import torch

from transformer_vq.bench.config import TrainBenchConfig
from transformer_vq.bench.isolate import host_options, run_cell
from transformer_vq.bench.load import OthersLoad, load_summary, load_text
from transformer_vq.bench.machine import median_seconds
from transformer_vq.bench.memory import PeakMemory
from transformer_vq.bench.report import memory_text, peak_gib, progress_note
from transformer_vq.bench.result import finish_result, no_progress, start_result

QUADRATIC = ("full", "flash_quad")


def _config(config: dict) -> TrainBenchConfig:
    return TrainBenchConfig.from_dict(config)


def _training_step(cfg: TrainBenchConfig, model: str):
    """``(step(ids), parameter count)``: one training step of a fresh ``model`` on ``ids [B, T + 1]``."""
    from transformer_vq.models.tvq.model import TransformerVQ

    torch.manual_seed(cfg.seed)
    net = TransformerVQ(cfg.cell_model(model)).to(cfg.device).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    autocast = torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.precision == "bfloat16")

    def step(ids):
        with autocast:
            out = net(ids[:, :-1], targets=ids[:, 1:])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        net.update_codebooks()

    return step, sum(p.numel() for p in net.parameters())


def _tokens(cfg: TrainBenchConfig, length: int) -> torch.Tensor:
    """Random token ids ``[B, T + 1]`` of the model's vocabulary on the benchmark's device (drawn on the CPU: the same
    tokens on every device)."""
    return torch.randint(0, cfg.model.vocab_size, (cfg.batch_size, length + 1)).to(cfg.device)


def train_cell(model: str, length: int, config: dict, repeats: int, warmup: int) -> dict:
    """Time training steps of one model at one length (run inside a cell process)."""
    cfg = _config(config)
    step, n_params = _training_step(cfg, model)
    ids = _tokens(cfg, length)
    with OthersLoad() as load, PeakMemory(cfg.device) as peak:
        seconds, samples = median_seconds(lambda: step(ids), repeats=repeats, warmup=warmup, device=cfg.device)
    return {"status": "ok", "step_s": seconds, "step_samples": samples,
            "tokens_per_s": cfg.batch_size * length / seconds,
            "parameters": n_params, **peak.figures(), "others_load": load.summary()}


def interleaved_cell(config: dict) -> dict:
    """Every (model, T) in this process: a warm-up step of each (increasing T, skipping those whose step is estimated
    over budget), then ``repeats`` rounds of one step of each; per-(model, T) medians."""
    from transformer_vq.bench.isolate import _is_oom

    cfg = _config(config)
    steps = {model: _training_step(cfg, model) for model in cfg.models}
    ids = {length: _tokens(cfg, length) for length in cfg.lengths}
    cells, last = {}, {}
    for length in sorted(cfg.lengths):
        for model in cfg.models:
            key = f"{model}@{length}"
            if model in last:
                power = 2 if model.split("/")[0] in QUADRATIC else 1
                est = last[model][1] * (length / last[model][0]) ** power
                if est > cfg.budget_s:
                    cells[key] = {"status": "skipped", "estimated_s": round(est, 1)}
                    continue
            try:
                seconds, _ = median_seconds(lambda: steps[model][0](ids[length]), repeats=1, warmup=0,
                                            device=cfg.device)
            except (RuntimeError, MemoryError) as error:
                if not _is_oom(error):
                    raise
                cells[key] = {"status": "oom", "error": f"{type(error).__name__}: {error}"[:300]}
                continue
            last[model] = (length, seconds)
            cells[key] = {"status": "ok", "step_samples": [], "parameters": steps[model][1]}
    running = [key for key, cell in cells.items() if cell["status"] == "ok"]
    peaks = {key: PeakMemory(cfg.device) for key in running}  # each (model, T)'s peak over its own steps
    loads = defaultdict(list)  # each (model, T)'s samples of the others' load, over its own steps
    for _ in range(cfg.repeats):
        for key in running:
            model, length = key.split("@")
            with OthersLoad() as load, peaks[key]:
                seconds, _ = median_seconds(lambda: steps[model][0](ids[int(length)]), repeats=1, warmup=0,
                                            device=cfg.device)
            loads[key].extend(load.samples)
            cells[key]["step_samples"].append(seconds)
    for key in running:
        cell = cells[key]
        cell.update(peaks[key].figures(), others_load=load_summary(loads[key]))
        cell["step_s"] = statistics.median(cell["step_samples"])
        cell["tokens_per_s"] = cfg.batch_size * int(key.split("@")[1]) / cell["step_s"]
    return {"status": "ok", "cells": cells}


def run_train_bench(cfg: TrainBenchConfig, log=print, progress=no_progress) -> dict:
    """Run every (model, length) cell; return the JSON-ready result. ``progress(result)``, if given, receives the
    result so far (``complete`` False) after each cell, so that a run stopped part way keeps what it measured."""
    result = start_result("train", cfg, models=list(cfg.models))
    rows = result["rows"]
    if cfg.interleaved:
        rows += _run_interleaved(cfg, log)
    else:
        _run_cells(cfg, log, rows, lambda: progress(result))
    return finish_result(result, scaling=[s for s in (scaling(rows, model) for model in cfg.models) if s])


def _run_cells(cfg: TrainBenchConfig, log, rows: list[dict], saved) -> None:
    """One process per (model, T) cell, each appended to ``rows`` and ``saved()`` as it finishes."""
    for model in cfg.models:
        last = None  # (length, step_s) of the last cell that ran
        for length in cfg.lengths:
            row = {"model": model, "T": length}
            est = None
            if last is not None:
                power = 2 if model.split("/")[0] in QUADRATIC else 1
                est = last[1] * (length / last[0]) ** power
            if est is not None and est > cfg.budget_s:
                row.update(status="skipped", estimated_s=round(est, 1))
            else:
                # a long cell times one step, but still after a warm-up step: the first step of a process
                # page-faults its whole heap in, which is neither its speed nor (retained) its steady memory
                repeats = 1 if est is not None and est > 10 else cfg.repeats
                row.update(run_cell("transformer_vq.bench.train:train_cell",
                                    {"model": model, "length": length, "config": asdict(cfg), "repeats": repeats,
                                     "warmup": 1},
                                    isolate=cfg.isolate, timeout_s=max(600.0, 5 * (est or 0) * (repeats + 1)),
                                    **host_options(cfg)))
                if row.get("status") == "ok":
                    last = (length, row["step_s"])
            rows.append(row)
            log(_line(row))
            saved()


def scaling(rows: list[dict], model: str) -> dict | None:
    """How ``model``'s step scales with T over its measured lengths (None below two): the least-squares line of peak
    memory against T (``gib_per_1k_tokens`` per 1,024 tokens, ``intercept_gib`` at T = 0, ``max_residual_gib`` the
    farthest a measured peak lies from it) and ``tokens_per_s_max_over_min`` (1.0 is perfectly flat)."""
    ok = [r for r in rows if r["model"] == model and r.get("status") == "ok" and peak_gib(r) is not None]
    if len({r["T"] for r in ok}) < 2:
        return None
    lengths, peaks = [r["T"] for r in ok], [peak_gib(r) for r in ok]
    slope, intercept = statistics.linear_regression(lengths, peaks)
    speeds = [r["tokens_per_s"] for r in ok]
    return {"model": model, "lengths": lengths, "gib_per_1k_tokens": slope * 1024, "intercept_gib": intercept,
            "max_residual_gib": max(abs(p - (intercept + slope * t)) for t, p in zip(lengths, peaks)),
            "tokens_per_s_max_over_min": max(speeds) / min(speeds)}


def _run_interleaved(cfg: TrainBenchConfig, log) -> list[dict]:
    result = run_cell("transformer_vq.bench.train:interleaved_cell", {"config": asdict(cfg)}, isolate=cfg.isolate,
                      timeout_s=None, **host_options(cfg))
    cells = result.pop("cells", {})
    rows = []
    for model in cfg.models:
        for length in cfg.lengths:
            row = {"model": model, "T": length, **result, **cells.get(f"{model}@{length}", {})}
            rows.append(row)
            log(_line(row))
    return rows


def _line(row: dict) -> str:
    head = f"{row['model']:>16} T={row['T']:>7}"
    note = progress_note(row, "est. {estimated_s:.0f} s per step")
    if note:
        return f"{head}  {note}"
    return (f"{head}  {row['tokens_per_s']:.0f} tokens/s  ({row['step_s']:.2f} s per step)  peak RSS {memory_text(row)}"
            f"  {load_text(row['others_load'])}")
