"""Where the time of one attention operator call goes: torch.profiler, self CPU time by kind of op.

    python benchmarks/profile_op.py --method vq-serial --length 8192 [--backward] [--out FILE.json]

Runs the same inputs as ``tvq bench op`` (``transformer_vq.bench.op``), profiles one call after a warm-up, and sums the
self CPU time of the matmul kernels (``bmm``, ``mm``, ``addmm``, ``baddbmm``) against everything else (elementwise
passes, copies, concatenations, scatters, reductions). This is the evidence of what bounds the operator: the share of
time that is not matmul is time the matmul units sit idle.

Per kernel (``kernels``): every op and input shapes, its self time, how many calls, and for the matmul kernels the FLOPs
their shapes imply and the rate they ran at, beside the square 2048^3 fp32 product and the operator's own matmuls
alone at their shapes (``transformer_vq.bench.op_methods.vq_matmuls``), both measured right before the profiled
call. ``--rounds`` profiles that many calls and reports the median round per kernel.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.machine import load_average, machine_info, matmul_gflops
from transformer_vq.bench.op_methods import forward_flops, make_inputs, method_fn, vq_matmuls
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty

MATMUL_OPS = {"aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm"}


def matmul_flops(op: str, shapes: list) -> float | None:
    """FLOPs of one call of a matmul kernel from its input shapes (``None`` for other ops)."""
    if op == "aten::mm":
        (m, k), (_, n) = shapes[0], shapes[1]
        return 2.0 * m * k * n
    if op == "aten::addmm":
        (m, k), (_, n) = shapes[1], shapes[2]
        return 2.0 * m * k * n
    if op == "aten::bmm":
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return 2.0 * b * m * k * n
    if op in ("aten::baddbmm", "aten::baddbmm_"):
        (b, m, k), (_, _, n) = shapes[1], shapes[2]
        return 2.0 * b * m * k * n
    return None


def kernels(prof) -> list[dict]:
    """Self time per (op, input shapes), largest first, with each matmul kernel's FLOPs and achieved GFLOP/s."""
    out = []
    for event in prof.key_averages(group_by_input_shape=True):
        shapes = [list(s) for s in event.input_shapes if s]
        seconds = event.self_cpu_time_total / 1e6
        if seconds <= 0:
            continue
        row = {"op": event.key, "shapes": shapes, "calls": event.count, "self_s": seconds}
        try:
            flops = matmul_flops(event.key, shapes)
        except (ValueError, IndexError):
            flops = None
        if flops is not None:
            row.update(flops=flops * event.count, gflops=flops * event.count / seconds / 1e9)
        out.append(row)
    return sorted(out, key=lambda r: -r["self_s"])


def profile_op(method: str, length: int, backward: bool, cfg: OpBenchConfig) -> dict:
    x = make_inputs(cfg, length)
    fn = method_fn(method, cfg, x)
    if backward:
        for name in ("q", "k", "v", "bias"):
            x[name].requires_grad_()

    def call():
        out = fn()
        if backward:
            out.sum().backward()

    with torch.set_grad_enabled(backward):
        call()
        peak = matmul_gflops(torch.float32)
        shaped = vq_matmuls(cfg, length)
        shaped()
        start = time.perf_counter()
        shaped()
        shaped_gflops = forward_flops("vq-serial", cfg, length) / (time.perf_counter() - start) / 1e9
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start  # unprofiled: the profiler's own cost is not the operator's
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            call()
    by_op = defaultdict(float)
    for event in prof.key_averages():
        by_op[event.key] += event.self_cpu_time_total / 1e6
    total = sum(by_op.values())
    matmul = sum(t for op, t in by_op.items() if op in MATMUL_OPS)
    flops = forward_flops(method, cfg, length) * (3 if backward else 1)
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {
        "method": method, "T": length, "backward": backward, "total_s": total, "matmul_s": matmul,
        "matmul_share": matmul / total, "matmul_gflops_inside_matmul_ops": flops / matmul / 1e9,
        "matmul_gflops_machine": peak, "vq_matmuls_gflops": shaped_gflops, "wall_s_unprofiled": wall,
        "gflops_unprofiled": flops / wall / 1e9, "load_average": load_average(),
        "top_ops": [{"op": op, "self_s": t, "share": t / total} for op, t in top],
        "kernels": [{**k, "share": k["self_s"] / total} for k in kernels(prof)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", type=not_empty, default="vq-serial")
    parser.add_argument("--length", type=int_at_least(1), default=8192)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--out", type=not_empty, help="write the result (with machine info) to this JSON file")
    parser.add_argument("--retain-host-memory", action="store_true",
                        help="keep freed memory for reuse, as tvq bench and tvq train do (default: glibc's)")
    args = parser.parse_args()
    if args.retain_host_memory:
        from transformer_vq.hostmem import retain_freed_memory

        retain_freed_memory()
    result = profile_op(args.method, args.length, args.backward, OpBenchConfig())
    print(f"{result['method']} T={result['T']} {'fwd+bwd' if args.backward else 'fwd'}: {result['total_s']:.3f} s "
          f"profiled, matmul ops {result['matmul_s']:.3f} s ({100 * result['matmul_share']:.0f}%), running at "
          f"{result['matmul_gflops_inside_matmul_ops']:.0f} GFLOP/s vs {result['matmul_gflops_machine']:.0f} for a "
          f"2048^3 matmul; load {result['load_average']}")
    print(f"unprofiled: {result['wall_s_unprofiled']:.3f} s = {result['gflops_unprofiled']:.0f} GFLOP/s; the "
          f"operator's matmuls alone at its shapes {result['vq_matmuls_gflops']:.0f} GFLOP/s")
    for row in result["top_ops"]:
        print(f"  {row['op']:<28} {row['self_s']:.3f} s  {100 * row['share']:.1f}%")
    print("per kernel (op, input shapes):")
    for row in result["kernels"][:20]:
        rate = f"  {row['gflops']:.0f} GFLOP/s" if "gflops" in row else ""
        print(f"  {row['op']:<22} {row['calls']:>4} x {str(row['shapes'])[:70]:<70} {row['self_s']:.3f} s "
              f"{100 * row['share']:.1f}%{rate}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": command_line(), "profile": result, "retain_host_memory": args.retain_host_memory,
                       "machine": machine_info(measure_peak=False)}, f, indent=1)


if __name__ == "__main__":
    main()
