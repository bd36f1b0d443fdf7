"""Operator time against the codebook size S at a fixed length: the second experiment of the VQ-QK report.

    python benchmarks/codebook_sweep.py [--length 16384] [--sizes 256 512 1024 2048 4096 8192] [--out DIR]

Times the forward pass of the causal and non-causal VQ operators (key-only and with quantized queries) at one
sequence length for each codebook size, with the report's head width (Dk = Dv = 512, one head, batch 1) and the same
inputs and cells as ``tvq bench op`` (one process per cell; ``transformer_vq.bench.op``). SDPA does not depend on S:
it is timed once, at the first size, as the yardstick. Writes ``NAME.json`` (every cell, the machine, the commit),
``NAME.md`` (a table of forward times and tokens/s by S) and ``NAME.png`` (forward time against S, log-log).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from result_files import save_figure

from transformer_vq.bench.config import OpBenchConfig
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.bench.op import run_op_bench
from transformer_vq.bench.report import machine_lines, _seconds
from transformer_vq.config import PRESETS
from transformer_vq.config.flags import file_stem, float_in, int_at_least, not_empty

VQ_METHODS = ("vq-serial", "vq-qk", "vq-bidir", "vq-qk-bidir")
BASELINES = ("sdpa", "sdpa-bidir")


def sweep(length: int, sizes: list[int], repeats: int, budget_s: float, log=print) -> dict:
    """Every cell of the sweep: ``{"rows": [...], "machine": ..., "config": ...}``."""
    machine = machine_info()
    rows = []
    for i, n_code in enumerate(sizes):
        model = PRESETS["enwik8"].replace(d_k=512, d_v=512, n_code=n_code, block_len=512)
        methods = VQ_METHODS + (BASELINES if i == 0 else ())
        cfg = OpBenchConfig(model=model, lengths=(length,), methods=methods, backward=False, repeats=repeats,
                            budget_s=budget_s)
        log(f"S = {n_code}")
        for row in run_op_bench(cfg, log=log)["rows"]:
            rows.append({"S": n_code, **row})
    return {"benchmark": "codebook-sweep", "command": command_line(), "length": length, "sizes": sizes, "rows": rows,
            "machine": machine,
            "config": {"d_k": 512, "d_v": 512, "block_len": 512, "batch_size": 1, "precision": "float32"},
            "load_average_end": machine_info(measure_peak=False)["load_average_start"]}


def sweep_table(result: dict) -> str:
    """Forward seconds (and tokens/s) by codebook size, one column per method."""
    methods = list(dict.fromkeys(r["method"] for r in result["rows"]))
    lines = [f"### Forward time against codebook size S at T = {result['length']} (Dk = Dv = 512, B = 1, fp32)", "",
             "| S | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
    for n_code in result["sizes"]:
        cells = []
        for method in methods:
            # a baseline has one cell (timed at the first size); a VQ method one per size
            row = next((r for r in result["rows"] if r["method"] == method
                        and (method in BASELINES or r["S"] == n_code)), None)
            if row is None or row.get("status") != "ok":
                cells.append("-" if row is None else row.get("status", "-"))
            else:
                cells.append(f"{_seconds(row['forward_s'])} ({result['length'] / row['forward_s']:,.0f} tok/s)")
        lines.append(f"| {n_code} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "SDPA does not depend on S: its row is the same cell, timed once.", ""]
                     + machine_lines(result))


def plot_sweep(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(r["method"] for r in result["rows"]):
        points = [(r["S"], r["forward_s"]) for r in result["rows"] if r["method"] == method and r.get("status") == "ok"]
        if method in BASELINES and points:
            ax.axhline(points[0][1], linestyle="--", color="gray")
            ax.annotate(method, (result["sizes"][0], points[0][1]), fontsize=8)
        elif points:
            ax.plot(*zip(*points), marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("codebook size S")
    ax.set_ylabel(f"forward seconds at T = {result['length']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int_at_least(1), default=16384)
    parser.add_argument("--sizes", type=int_at_least(1), nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int_at_least(1), default=3)
    parser.add_argument("--budget-s", type=float_in(0, low_open=True), default=300.0)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--name", type=file_stem, default=None)
    args = parser.parse_args()
    result = sweep(args.length, args.sizes, args.repeats, args.budget_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"codebook-sweep-{result['machine']['date_utc'][:10]}-{result['machine']['logical_cpus']}cpu"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(sweep_table(result) + "\n")
    plot_sweep(result, out / f"{name}.png")
    print(sweep_table(result))


if __name__ == "__main__":
    main()
