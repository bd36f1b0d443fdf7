"""Where the time of one attention operator call goes: torch.profiler, self CPU time by kind of op.

    python benchmarks/profile_op.py --method vq-serial --length 8192 [--backward] [--out FILE.json]

Runs the same inputs as ``tvq bench op`` (``transformer_vq.bench.op``), profiles one call after a warm-up, and sums the
self CPU time of the matmul kernels (``bmm``, ``mm``, ``addmm``, ``baddbmm``) against everything else (elementwise
passes, copies, concatenations, scatters, reductions). This is the evidence of what bounds the operator: the share of
time that is not matmul is time the matmul units sit idle.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.machine import load_average, machine_info, matmul_gflops
from transformer_vq.bench.op_methods import forward_flops, make_inputs, method_fn

MATMUL_OPS = {"aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm"}


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
        with profile(activities=[ProfilerActivity.CPU]) as prof:
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
        "matmul_gflops_machine": peak, "load_average": load_average(),
        "top_ops": [{"op": op, "self_s": t, "share": t / total} for op, t in top],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="vq-serial")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--out", help="write the result (with machine info) to this JSON file")
    args = parser.parse_args()
    result = profile_op(args.method, args.length, args.backward, OpBenchConfig())
    print(f"{result['method']} T={result['T']} {'fwd+bwd' if args.backward else 'fwd'}: {result['total_s']:.3f} s "
          f"profiled, matmul ops {result['matmul_s']:.3f} s ({100 * result['matmul_share']:.0f}%), running at "
          f"{result['matmul_gflops_inside_matmul_ops']:.0f} GFLOP/s vs {result['matmul_gflops_machine']:.0f} for a "
          f"2048^3 matmul; load {result['load_average']}")
    for row in result["top_ops"]:
        print(f"  {row['op']:<28} {row['self_s']:.3f} s  {100 * row['share']:.1f}%")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"profile": result, "machine": machine_info(measure_peak=False)}, f, indent=1)


if __name__ == "__main__":
    main()
