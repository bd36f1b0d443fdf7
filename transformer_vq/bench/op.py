"""``tvq bench op``: one attention layer's attention computation, VQ (each reduction) against full attention and FLASH.

For each method and sequence length ``T`` it times the forward pass and the forward + backward pass of the operator
alone (inputs already projected: ``q, k, v, bias`` as the layer hands them over), counts the matmul FLOPs the method
executes, and reports achieved GFLOP/s next to the matmul GFLOP/s of the machine measured in the same run, the speedup
over SDPA, and the peak memory of the cell. The matmul GFLOP/s is measured again inside each cell, right before it
is timed, and the fraction of peak of that cell is taken against it.

Methods:
  * ``vq-serial``, ``vq-matmul``, ``vq-assoc``: ``transformer_vq.ops.vq.vq_attention`` with each cache reduction;
  * ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` with no bias, the fastest exact
    quadratic attention PyTorch offers (the yardstick of the speedup targets);
  * ``full``: ``transformer_vq.ops.full.full_attention``, the project's quadratic baseline (SDPA with the window bias);
  * ``flash``: ``transformer_vq.ops.flash.flash_attention`` (mixed chunk), ``flash_quad`` (squared ReLU, quadratic).

Memory is the peak resident set size (``ru_maxrss``) of the process that ran the cell, above its size after importing
torch: it includes the inputs and the autograd graph, and nothing of other cells (each runs in its own process).
Cells whose estimated time exceeds the budget are not run and are reported as ``skipped`` with the estimate.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.isolate import run_cell
from transformer_vq.bench.machine import machine_info, matmul_gflops, median_seconds
from transformer_vq.bench.report import progress_note

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def forward_flops(method: str, cfg: OpBenchConfig, length: int) -> float:
    """Matmul FLOPs the method executes in the forward pass (multiply-add = 2 FLOPs; elementwise work not counted).

    * VQ, per query and head: scores against S codewords and the 2L keys of the two-block window (the current
      block is computed whole, then masked), then the same weights times the values:
      ``2 (S + 2L) (Dk + Dv)``. The ``matmul`` reduction adds its lower-triangular product over blocks,
      ``2 * N (N + 1) / 2 * S * Dv`` per group; ``serial`` and ``assoc`` merge elementwise (not counted).
    * SDPA causal: the kernel skips masked tiles, so ``2 * T^2 / 2 * (Dk + Dv)`` per head.
    * full / flash_quad: one block of L query rows at a time against every key up to the block's end:
      ``2 * sum_n L * (n + 1) L * (Dk + Dv)`` per head.
    * flash: ``2 T C (Dk + Dv)`` per head inside chunks, plus ``2 T Dk Dv`` per group for the chunk sums of
      ``k v^T`` and ``2 T Dk Dv`` per head to apply them.
    """
    m = cfg.model
    b, h, g = cfg.batch_size, m.n_head, m.n_kv_head
    d = m.d_k + m.d_v
    L, S = m.block_len, m.n_code
    if method.startswith("vq"):
        flops = 2 * b * h * length * (S + 2 * L) * d
        if method == "vq-matmul":
            n = length // L
            flops += 2 * b * g * n * (n + 1) / 2 * S * m.d_v
        return float(flops)
    if method == "sdpa":
        return float(b * h * length * length * d)
    if method in ("full", "flash_quad"):
        keys = sum(min(length, (n + 1) * L) * (min(length, (n + 1) * L) - n * L) for n in range(-(-length // L)))
        return float(2 * b * h * keys * d)
    if method == "flash":
        C = m.flash_chunk_len
        padded = -(-length // C) * C
        return float(2 * b * h * padded * C * d + 2 * (b * g + b * h) * padded * m.d_k * m.d_v)
    raise ValueError(method)


def make_inputs(cfg: OpBenchConfig, length: int) -> dict:
    """Inputs as the layer makes them: RMS-normalized q, k scaled by ``Dk^-1/4``, SiLU values, a small bias."""
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = DTYPES[cfg.precision]
    m = cfg.model
    b, h, g = cfg.batch_size, m.n_head, m.n_kv_head

    def unit(*shape):
        x = torch.randn(*shape, generator=gen)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True)) * m.d_k**-0.25

    q = unit(b, h, length, m.d_k)
    codebook = unit(g, m.n_code, m.d_k)
    z = torch.randint(0, m.n_code, (b, g, length), generator=gen)
    k_hat = torch.gather(codebook.unsqueeze(0).expand(b, -1, -1, -1), 2, z.unsqueeze(-1).expand(-1, -1, -1, m.d_k))
    v = torch.nn.functional.silu(torch.randn(b, g, length, m.d_v, generator=gen))
    bias = 0.1 * torch.randn(b, h, length, 2 * m.block_len, generator=gen)
    return {"q": q.to(dtype), "k": k_hat.to(dtype), "z": z, "v": v.to(dtype), "codebook": codebook.to(dtype),
            "bias": bias.to(dtype)}


def _method_fn(method: str, cfg: OpBenchConfig, x: dict):
    """A closure computing the method's output from the tensors in ``x``."""
    if method.startswith("vq"):
        from transformer_vq.ops.vq import vq_attention

        reduction = method.split("-")[1]
        return lambda: vq_attention(x["q"], x["k"], x["v"], x["bias"], block_len=cfg.model.block_len, z=x["z"],
                                    codebook=x["codebook"], reduction=reduction)[0]
    if method == "sdpa":
        gqa = cfg.model.n_kv_head != cfg.model.n_head
        return lambda: torch.nn.functional.scaled_dot_product_attention(
            x["q"], x["k"], x["v"], is_causal=True, scale=1.0, enable_gqa=gqa)
    if method == "full":
        from transformer_vq.ops.full import full_attention

        return lambda: full_attention(x["q"], x["k"], x["v"], x["bias"], block_len=cfg.model.block_len)[0]
    if method == "flash":
        from transformer_vq.ops.flash import flash_attention

        return lambda: flash_attention(x["q"], x["k"], x["v"], x["bias"], block_len=cfg.model.block_len,
                                       chunk_len=cfg.model.flash_chunk_len)[0]
    if method == "flash_quad":
        from transformer_vq.ops.flash import flash_quad_attention

        return lambda: flash_quad_attention(x["q"], x["k"], x["v"], x["bias"], block_len=cfg.model.block_len)[0]
    raise ValueError(method)


def op_cell(method: str, length: int, config: dict, repeats: int, warmup: int, backward: bool) -> dict:
    """Time one method at one length (run inside a cell process by ``run_cell``)."""
    cfg = OpBenchConfig.from_dict(config)
    x = make_inputs(cfg, length)
    inputs_bytes = sum(t.nelement() * t.element_size() for t in x.values())
    fn = _method_fn(method, cfg, x)
    # The yardstick of this cell, measured in its own process right before it: on a shared machine the CPU time
    # available changes from minute to minute, so a peak measured once per run would not compare like with like.
    result = {"status": "ok", "inputs_bytes": inputs_bytes, "matmul_gflops": matmul_gflops(DTYPES[cfg.precision])}
    with torch.no_grad():
        result["forward_s"], result["forward_samples"] = median_seconds(fn, repeats=repeats, warmup=warmup)
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

        result["fwd_bwd_s"], result["fwd_bwd_samples"] = median_seconds(step, repeats=repeats, warmup=warmup)
    return result


def paired_cell(methods: list[str], length: int, config: dict, rounds: int, warmup: bool) -> dict:
    """Forward times of several methods on the same inputs, interleaved: one call of each method per round.

    Every round sees (nearly) the same load for every method, so the per-round time ratios are robust to a shared
    machine whose load drifts; their median is the paired speedup.
    """
    cfg = OpBenchConfig.from_dict(config)
    x = make_inputs(cfg, length)
    fns = {m: _method_fn(m, cfg, x) for m in methods}
    samples = {m: [] for m in methods}
    with torch.no_grad():
        if warmup:
            for fn in fns.values():
                fn()
        for _ in range(rounds):
            for method, fn in fns.items():
                seconds, _ = median_seconds(fn, repeats=1, warmup=0)
                samples[method].append(seconds)
    return {"status": "ok", "samples": samples}


def run_paired(cfg: OpBenchConfig, log=print) -> list[dict]:
    """For each length of ``cfg.paired``: every method's median forward time and median per-round speedup of each
    VQ method over each baseline that ran."""
    out = []
    for length in cfg.paired:
        slow = length > 8192
        result = run_cell("transformer_vq.bench.op:paired_cell",
                          {"methods": list(cfg.methods), "length": length, "config": asdict(cfg),
                           "rounds": cfg.repeats, "warmup": not slow},
                          isolate=cfg.isolate, timeout_s=3600.0, mem_limit_gib=cfg.mem_limit_gib or None)
        if result.get("status") != "ok":
            out.append({"T": length, **result})
            log(f"paired T={length}: {result.get('status')}: {result.get('error', '')}")
            continue
        samples = result["samples"]
        for method, times in samples.items():
            entry = {"T": length, "method": method, "forward_s": statistics.median(times), "samples": times,
                     "load_average_1min": result.get("load_average_1min"), "speedup": {}}
            if method.startswith("vq"):
                for base in ("sdpa", "full", "flash"):
                    if base in samples:
                        entry["speedup"][base] = statistics.median(b / m for b, m in zip(samples[base], times))
            out.append(entry)
            speed = "  ".join(f"{v:.1f}x vs {k}" for k, v in entry["speedup"].items())
            log(f"paired {method:>10} T={length:>7}  fwd {entry['forward_s']:.3f} s  {speed}")
    return out


def run_op_bench(cfg: OpBenchConfig, log=print) -> dict:
    """Run every (method, length) cell of ``cfg``; return the JSON-ready result with machine info and speedups."""
    machine = machine_info()
    rows = []
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
            backward = cfg.backward
            if est_fwd is not None and est_fwd > cfg.budget_s:
                row.update(status="skipped", estimated_forward_s=round(est_fwd, 1),
                           estimated_fwd_bwd_s=round(est_bwd, 1) if cfg.backward else None)
                rows.append(row)
                log(_line(row))
                continue
            if backward and est_bwd is not None and est_bwd > cfg.budget_s:
                backward = False
                row["estimated_fwd_bwd_s"] = round(est_bwd, 1)
            slow = est_fwd is not None and est_fwd > 5
            repeats, warmup = (1, 0) if slow else (cfg.repeats, 1)
            expected = (est_fwd or 0) * (repeats + warmup) + ((est_bwd or 0) * (repeats + warmup) if backward else 0)
            result = run_cell("transformer_vq.bench.op:op_cell",
                              {"method": method, "length": length, "config": asdict(cfg), "repeats": repeats,
                               "warmup": warmup, "backward": backward},
                              isolate=cfg.isolate, timeout_s=max(600.0, 3 * expected), mem_limit_gib=cfg.mem_limit_gib or None)
            row.update(result)
            if result.get("status") == "ok":
                row["forward_gflops"] = flops / result["forward_s"] / 1e9
                row["forward_fraction_of_peak"] = row["forward_gflops"] / result["matmul_gflops"]
                if "fwd_bwd_s" in result:
                    # Backward executes two matmuls per forward matmul: 3x the forward FLOPs in all.
                    row["fwd_bwd_gflops"] = 3 * flops / result["fwd_bwd_s"] / 1e9
                last = (length, result["forward_s"], result.get("fwd_bwd_s"))
            rows.append(row)
            log(_line(row))
    return {"benchmark": "op", "config": asdict(cfg), "machine": machine, "rows": rows, "speedups": speedups(rows),
            "paired": run_paired(cfg, log), "load_average_end": machine_info(measure_peak=False)["load_average_start"]}


def speedups(rows: list[dict], baselines=("sdpa", "full")) -> list[dict]:
    """Forward (and forward + backward) time of each baseline divided by each VQ method's, per length.

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
        if not method.startswith("vq"):
            continue
        for base in baselines:
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
    text = (f"{head}  fwd {row['forward_s']:.3f} s  {row['forward_gflops']:.0f} GFLOP/s "
            f"({100 * row['forward_fraction_of_peak']:.0f}% of matmul {row['matmul_gflops']:.0f})")
    if "fwd_bwd_s" in row:
        text += f"  fwd+bwd {row['fwd_bwd_s']:.3f} s"
    if "peak_rss_bytes" in row:
        text += f"  peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB"
    return text
