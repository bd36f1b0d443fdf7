"""``tvq bench op``: one attention layer's attention computation, VQ (each reduction) against full attention and FLASH.

For each method and sequence length ``T`` it times the forward pass and the forward + backward pass of the operator
alone (inputs already projected: ``q, k, v, bias`` as the layer hands them over), counts the matmul FLOPs the method
executes, and reports achieved GFLOP/s next to the matmul GFLOP/s of the machine measured in the same run, the speedup
over SDPA, and the peak memory of the cell. The matmul GFLOP/s is measured again inside each cell, right before it
is timed, and the fraction of peak of that cell is taken against it.

The methods, their inputs and FLOP counts are in :mod:`transformer_vq.bench.op_methods`.

Memory is the peak of each pass (:mod:`transformer_vq.bench.memory`): the process's resident set high-water mark
during the forward passes and during the forward + backward passes, and how far each rose above the RSS before it
(the inputs are already there; the autograd graph and the workspaces are not); on CUDA the allocator's peak. Each cell
runs in its own process, so nothing of another cell is in it; in the paired comparison each method's peak is taken
over its own calls.
Cells whose estimated time exceeds the budget are not run and are reported as ``skipped`` with the estimate.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace

import torch

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.isolate import budget_plan, host_options, run_cell
from transformer_vq.bench.load import OthersLoad, load_summary, load_text
from transformer_vq.bench.machine import matmul_gflops, median_seconds
from transformer_vq.bench.memory import PeakMemory
from transformer_vq.bench.op_methods import (CAUSAL_VQ, DTYPES, baselines_of, forward_flops, is_vq, make_inputs,
                                             method_fn, vq_matmuls)
from transformer_vq.bench.report import gflops_text, memory_text, progress_note, ratio_text
from transformer_vq.bench.result import finish_result, no_progress, start_result


def op_cell(method: str, length: int, config: dict, repeats: int, warmup: int, backward: bool) -> dict:
    """Time one method at one length (run inside a cell process by ``run_cell``)."""
    cfg = OpBenchConfig.from_dict(config)
    x = make_inputs(cfg, length)
    inputs_bytes = sum(t.nelement() * t.element_size() for t in x.values())
    fn = method_fn(method, cfg, x)
    # The yardstick of this cell, measured in its own process right before it: on a shared machine the CPU time
    # available changes from minute to minute, so a peak measured once per run would not compare like with like.
    result = {"status": "ok", "inputs_bytes": inputs_bytes,
              "matmul_gflops": matmul_gflops(DTYPES[cfg.precision], device=cfg.device)}
    warmup = max(warmup, int(cfg.torch_compile))  # compilation is never timed
    with torch.no_grad(), PeakMemory(cfg.device) as peak:
        result["forward_s"], result["forward_samples"] = median_seconds(fn, repeats=repeats, warmup=warmup,
                                                                        device=cfg.device)
    result.update(peak.figures("forward_"))
    if backward:
        for name in ("q", "k", "v", "bias"):
            x[name].requires_grad_()
        out = fn()
        cotangent = torch.randn_like(out)
        del out

        def step():
            for name in ("q", "k", "v", "bias"):
                x[name].grad = None
            fn().backward(cotangent)

        with PeakMemory(cfg.device) as peak:
            result["fwd_bwd_s"], result["fwd_bwd_samples"] = median_seconds(step, repeats=repeats, warmup=warmup,
                                                                            device=cfg.device)
        result.update(peak.figures("fwd_bwd_"))
    return result


COMPILED = "+compile"
"""Suffix of a method's compiled twin in the paired comparison (``vq-serial+compile``)."""


def paired_cell(methods: list[str], length: int, config: dict, rounds: int, warmup: bool) -> dict:
    """Forward times of several methods on the same inputs, interleaved: one call of each method per round, and
    the matmul rate once per round (the yardstick each round's fraction of peak is taken against). With a causal VQ
    method among them, each round also times the VQ operator's matmuls alone at their own shapes
    (:func:`~transformer_vq.bench.op_methods.vq_matmuls`, ``vq_matmuls_gflops``): the fair yardstick of the
    operator, whose fraction says how much of its time runs at its matmuls' rate.

    Every round sees (nearly) the same load for every method, so the per-round time ratios are robust to a shared
    machine whose load drifts; their median is the paired speedup. With ``torch_compile`` every method runs twice
    per round, eager and compiled (``METHOD+compile``): the paired measure of what compiling buys.
    """
    cfg = OpBenchConfig.from_dict(config)
    x = make_inputs(cfg, length)
    eager = replace(cfg, torch_compile=False)
    fns = {m: method_fn(m, eager, x) for m in methods}
    if cfg.torch_compile:
        fns.update({m + COMPILED: method_fn(m, cfg, x) for m in methods})
    samples = {m: [] for m in fns}
    samples["matmul_gflops"] = []
    shaped = vq_matmuls(cfg, length) if any(m in CAUSAL_VQ for m in methods) and length % cfg.model.block_len == 0 \
        else None
    if shaped is not None:
        samples["vq_matmuls_gflops"] = []
    peaks = {m: PeakMemory(cfg.device) for m in fns}
    loads = {m: [] for m in samples}  # the others' load during each method's calls (and the yardstick's)
    with torch.no_grad():
        if warmup or cfg.torch_compile:  # compilation is never timed
            for fn in fns.values():
                fn()
        for _ in range(rounds):
            with OthersLoad(interval=0.2) as load:
                samples["matmul_gflops"].append(matmul_gflops(DTYPES[cfg.precision], device=cfg.device))
            loads["matmul_gflops"].extend(load.samples)
            if shaped is not None:
                with OthersLoad(interval=0.2) as load:
                    seconds, _ = median_seconds(shaped, repeats=1, warmup=1, device=cfg.device)
                samples["vq_matmuls_gflops"].append(forward_flops("vq-serial", cfg, length) / seconds / 1e9)
                loads["vq_matmuls_gflops"].extend(load.samples)
            for method, fn in fns.items():
                with OthersLoad(interval=0.2) as load, peaks[method]:
                    seconds, _ = median_seconds(fn, repeats=1, warmup=0, device=cfg.device)
                samples[method].append(seconds)
                loads[method].extend(load.samples)
    return {"status": "ok", "samples": samples, "peaks": {m: p.figures() for m, p in peaks.items()},
            "others_load": {m: load_summary(v) for m, v in loads.items()}}


def run_paired(cfg: OpBenchConfig, log=print) -> list[dict]:
    """For each length of ``cfg.paired``: every method's median forward time, its median per-round fraction of the
    matmul rate, the median per-round speedup of each VQ method over each (eager) baseline that ran, and for a
    compiled twin its median per-round speedup over the eager method."""
    out = []
    for length in cfg.paired:
        slow = length > 8192
        result = run_cell("transformer_vq.bench.op:paired_cell",
                          {"methods": list(cfg.methods), "length": length, "config": asdict(cfg),
                           "rounds": cfg.repeats, "warmup": not slow},
                          isolate=cfg.isolate, timeout_s=3600.0, **host_options(cfg))
        if result.get("status") != "ok":
            out.append({"T": length, **result})
            log(f"paired T={length}: {result.get('status')}: {result.get('error', '')}")
            continue
        samples, peaks, loads = result["samples"], result["peaks"], result["others_load"]
        rates, shaped = samples.pop("matmul_gflops"), samples.pop("vq_matmuls_gflops", None)
        log(f"paired T={length}: matmul yardstick median {statistics.median(rates):.0f} GFLOP/s over {len(rates)} "
            f"rounds, {load_text(loads['matmul_gflops'])}")
        if shaped:
            log(f"paired T={length}: the VQ operator's matmuls alone, at its shapes: median "
                f"{statistics.median(shaped):.0f} GFLOP/s, {load_text(loads['vq_matmuls_gflops'])}")
        for method, times in samples.items():
            base = method.removesuffix(COMPILED)
            flops = forward_flops(base, cfg, length)
            entry = {"T": length, "method": method, "forward_s": statistics.median(times), "samples": times,
                     "matmul_gflops": statistics.median(rates),
                     "fraction_of_peak": statistics.median(flops / t / 1e9 / r for t, r in zip(times, rates)),
                     "load_average_1min": result.get("load_average_1min"), "others_load": loads[method],
                     "speedup": {}, **peaks[method]}
            if shaped and base in CAUSAL_VQ and base != "vq-qk":
                entry["vq_matmuls_gflops"] = statistics.median(shaped)
                entry["fraction_of_vq_matmuls"] = statistics.median(flops / t / 1e9 / r for t, r in zip(times, shaped))
            if is_vq(base):
                for other in baselines_of(base):
                    if other in samples:
                        entry["speedup"][other] = _paired_ratio(samples[other], times)
            if method != base:
                entry["compile_speedup"] = _paired_ratio(samples[base], times)
            out.append(entry)
            speed = "  ".join(f"{ratio_text(v)} vs {k}" for k, v in entry["speedup"].items())
            if "compile_speedup" in entry:
                speed += f"  {entry['compile_speedup']:.2f}x vs eager"
            log(f"paired {method:>10} T={length:>7}  fwd {entry['forward_s']:.3f} s  "
                f"{100 * entry['fraction_of_peak']:.0f}% of matmul"
                + (f" ({100 * entry['fraction_of_vq_matmuls']:.0f}% of its own matmuls' rate)"
                   if "fraction_of_vq_matmuls" in entry else "")
                + f"  {speed}  peak {memory_text(entry)}  "
                f"{load_text(entry['others_load'])}")
    return out


def _paired_ratio(slower: list[float], faster: list[float]) -> float:
    """The median over rounds of one method's time divided by another's (each round's pair saw the same load)."""
    return statistics.median(a / b for a, b in zip(slower, faster))


def run_op_bench(cfg: OpBenchConfig, log=print, progress=no_progress) -> dict:
    """Run every (method, length) cell of ``cfg``; return the JSON-ready result with machine info and speedups.

    ``progress(result)``, if given, receives the result so far (``complete`` False) after each row, so that a run
    stopped part way keeps what it measured."""
    result = start_result("op", cfg)
    rows = result["rows"]
    for method in cfg.methods:
        last = None  # (length, forward_s, fwd_bwd_s) of the last cell that ran, for estimates
        for length in cfg.lengths:
            flops = forward_flops(method, cfg, length)
            row = {"method": method, "T": length, "forward_flops": flops}
            est_fwd = est_bwd = None
            if last is not None:
                scale = flops / forward_flops(method, cfg, last[0])
                est_fwd = last[1] * scale
                est_bwd = last[2] * scale if last[2] is not None else 3 * est_fwd
            backward = budget_plan(row, est_fwd, est_bwd, cfg.budget_s, cfg.backward)
            if backward is None:
                rows.append(row)
                log(_line(row))
                progress(result)
                continue
            slow = est_fwd is not None and est_fwd > 5
            repeats, warmup = (1, 0) if slow else (cfg.repeats, 1)
            expected = (est_fwd or 0) * (repeats + warmup) + ((est_bwd or 0) * (repeats + warmup) if backward else 0)
            cell = run_cell("transformer_vq.bench.op:op_cell",
                            {"method": method, "length": length, "config": asdict(cfg), "repeats": repeats,
                             "warmup": warmup, "backward": backward},
                            isolate=cfg.isolate, timeout_s=max(600.0, 3 * expected),
                            **host_options(cfg))
            row.update(cell)
            if cell.get("status") == "ok":
                row["forward_gflops"] = flops / cell["forward_s"] / 1e9
                row["forward_fraction_of_peak"] = row["forward_gflops"] / cell["matmul_gflops"]
                if "fwd_bwd_s" in cell:
                    # Backward executes two matmuls per forward matmul: 3x the forward FLOPs in all.
                    row["fwd_bwd_gflops"] = 3 * flops / cell["fwd_bwd_s"] / 1e9
                last = (length, cell["forward_s"], cell.get("fwd_bwd_s"))
            rows.append(row)
            log(_line(row))
            progress(result)
    return finish_result(result, speedups=speedups(rows), paired=run_paired(cfg, log))


def speedups(rows: list[dict]) -> list[dict]:
    """Forward (and forward + backward) time of each baseline divided by each VQ method's, per length (the causal
    baselines SDPA and ``full`` for causal methods, non-causal SDPA for non-causal ones).

    Where a baseline cell was skipped its estimated time is used and the entry says ``estimated``.
    """
    def seconds(row, key):
        if row.get("status") == "ok" and key in row:
            return row[key], False
        if row.get(f"estimated_{key}") is not None:
            return row[f"estimated_{key}"], True
        return None, False

    by_key = {(r["method"], r["T"]): r for r in rows}
    out = []
    for (method, length), row in by_key.items():
        if not is_vq(method):
            continue
        for base in baselines_of(method):
            if base == "flash":
                continue
            other = by_key.get((base, length))
            if other is None:
                continue
            entry = {"method": method, "baseline": base, "T": length}
            for key in ("forward_s", "fwd_bwd_s"):
                mine, mine_est = seconds(row, key)
                theirs, theirs_est = seconds(other, key)
                if mine and theirs:
                    entry[key.replace("_s", "_speedup")] = theirs / mine
                    entry[key.replace("_s", "_estimated")] = mine_est or theirs_est
            out.append(entry)
    return out


def _line(row: dict) -> str:
    head = f"{row['method']:>10} T={row['T']:>7}"
    note = progress_note(row, "est. forward {estimated_forward_s:.0f} s")
    if note:
        return f"{head}  {note}"
    text = (f"{head}  fwd {row['forward_s']:.3f} s  {gflops_text(row['forward_gflops'])} GFLOP/s "
            f"({100 * row['forward_fraction_of_peak']:.0f}% of matmul {gflops_text(row['matmul_gflops'])})")
    text += f"  peak {memory_text(row, 'forward_')}"
    if "fwd_bwd_s" in row:
        text += f"  fwd+bwd {row['fwd_bwd_s']:.3f} s  peak {memory_text(row, 'fwd_bwd_')}"
    return text
