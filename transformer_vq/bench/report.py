"""Present a benchmark result: a table (markdown, printed on screen and saved), the JSON file and PNG plots.

The result dicts come from ``run_op_bench``, ``run_train_bench``, ``run_decode_bench`` and ``run_longvq_bench``;
every figure in the tables and plots is read from them, so a saved JSON file, loaded again, regenerates the table
and the plot (``write_report``).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.bench.config import LONGVQ_BASELINES, LONGVQ_SCORING
from transformer_vq.config.flags import output_dir


def _seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _cell_status(row: dict) -> str | None:
    status = row.get("status")
    if status == "skipped":
        est = row.get("estimated_forward_s") or row.get("estimated_s")
        return f"skipped (est. {_seconds(est)})"
    if status in ("oom", "timeout", "error"):
        return status.upper() if status == "oom" else status
    return None


CELL_KEYS = ("method", "model", "layer", "T", "context")
"""The fields that name a benchmark cell (each benchmark's rows hold some of them)."""


def failed_cells(result: dict) -> list[tuple[str, str]]:
    """``(cell, why)`` for every cell of ``result`` that failed (out of memory, over its timeout, an error); a cell
    skipped over the time budget was skipped as asked."""
    return [(" ".join(f"{k}={row[k]}" for k in CELL_KEYS if k in row), f"{row['status']}: {row.get('error', '')}")
            for row in result["rows"] if row.get("status") not in ("ok", "skipped")]


def progress_note(row: dict, skipped: str) -> str | None:
    """The progress line's text for a cell that was not measured: ``skipped (...)`` with ``skipped`` formatted
    from the row (e.g. ``"est. forward {estimated_forward_s:.0f} s"``), or its failure; None for a measured cell."""
    if row.get("status") == "skipped":
        return f"skipped ({skipped.format(**row)})"
    if row.get("status") != "ok":
        return f"{row.get('status')}: {row.get('error', '')}"
    return None


def ratio_text(ratio: float) -> str:
    """A speed ratio in words: two significant digits below 0.1 (0.023x, not 0.0x), two decimals below 1, one
    above."""
    return f"{ratio:.2g}x" if ratio < 0.1 else f"{ratio:.2f}x" if ratio < 1 else f"{ratio:.1f}x"


def gflops_text(rate: float) -> str:
    """A GFLOP/s figure: three significant digits, so a small rate does not print as 0."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def memory_text(row: dict, prefix: str = "") -> str:
    """A cell's peak memory (:mod:`transformer_vq.bench.memory`) for a table: the process's peak RSS and, in
    brackets, how far it rose over the cell (``1.20 GiB (+0.85)``), or the CUDA allocator's peak; ``-`` where none."""
    cuda = row.get(f"{prefix}cuda_peak_bytes")
    if cuda is not None:
        return f"{cuda / 2**30:.2f} GiB (CUDA)"
    peak, rise = row.get(f"{prefix}peak_rss_bytes"), row.get(f"{prefix}peak_rss_rise_bytes")
    if peak is None:
        return "-"
    return f"{peak / 2**30:.2f} GiB" + ("" if rise is None else f" (+{rise / 2**30:.2f})")


def _others(load: dict | None) -> str:
    """A cell's others' load (:func:`transformer_vq.bench.load.load_summary`) as ``mean / max``; ``-`` where none."""
    if not load or not load.get("samples"):
        return "-"
    return f"{load['others_runnable_mean']} / {load['others_runnable_max']}"


def peak_gib(row: dict) -> float | None:
    """A cell's peak memory in GiB: the CUDA allocator's on a GPU, else the process's peak RSS; None where none."""
    peak = row.get("cuda_peak_bytes", row.get("peak_rss_bytes"))
    return None if peak is None else peak / 2**30


def machine_lines(result: dict) -> list[str]:
    """The report's provenance bullets: the command, machine, the matmul rate when the run measured one, load,
    versions, commit."""
    m = result["machine"]
    command = f"`{result['command']}`" if result.get("command") else "not recorded"
    peak = m.get("matmul_gflops", {})
    load_end = result.get("load_average_end")
    matmul = ([f"- matmul measured in this run: fp32 {peak.get('float32', '-')} GFLOP/s, "
               f"bf16 {peak.get('bfloat16', '-')} GFLOP/s"] if peak else [])
    return [
        f"- command: {command}",
        f"- machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads, "
        f"{m['memory_gib']} GiB; flags {' '.join(m['cpu_flags'])}",
        *matmul,
        f"- load average (1/5/15 min) at start {m['load_average_start']}, at end {load_end} (the CPU is shared)",
        f"- torch {m['torch']}, numpy {m['numpy']}, python {m['python']}; commit {m['commit']}"
        f"{' (with uncommitted changes)' if m.get('dirty') else ''}; {m['date_utc']}",
    ]


def op_table(result: dict) -> str:
    cfg, m = result["config"], result["config"]["model"]
    groups = m["n_head"] if m["head_type"] == "mha" else 1
    lines = [
        f"### Operator: one attention layer, {cfg['precision']}, B={cfg['batch_size']} H={m['n_head']} G={groups} "
        f"Dk={m['d_k']} Dv={m['d_v']} S={m['n_code']} L={m['block_len']} (FLASH C={m['flash_chunk_len']})",
        "",
        "| method | T | forward | fwd tokens/s | GFLOP/s (% of matmul) | fwd peak RSS (rise) | fwd+bwd "
        "| fwd+bwd GFLOP/s | fwd+bwd peak RSS (rise) | fwd speedup vs sdpa | fwd+bwd speedup vs sdpa "
        "| matmul GFLOP/s (cell) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    # a causal method against causal SDPA, a non-causal one against non-causal SDPA
    speed = {(s["method"], s["T"]): s for s in result.get("speedups", []) if s["baseline"] in ("sdpa", "sdpa-bidir")}
    for row in result["rows"]:
        status = _cell_status(row)
        head = f"| {row['method']} | {row['T']} |"
        if status:
            lines.append(f"{head} {status} | | | | | | | | | | |")
            continue
        bwd = _seconds(row.get("fwd_bwd_s")) if "fwd_bwd_s" in row else (
            f"skipped (est. {_seconds(row['estimated_fwd_bwd_s'])})" if row.get("estimated_fwd_bwd_s") else "-")
        bwd_gf = gflops_text(row["fwd_bwd_gflops"]) if "fwd_bwd_gflops" in row else "-"
        s = speed.get((row["method"], row["T"]), {})
        sp = [ratio_text(s[k]) + (" (est.)" if s[k.replace("speedup", "estimated")] else "") if k in s else "-"
              for k in ("forward_speedup", "fwd_bwd_speedup")]
        lines.append(f"{head} {_seconds(row['forward_s'])} | {row['T'] / row['forward_s']:,.0f} | "
                     f"{gflops_text(row['forward_gflops'])} "
                     f"({100 * row['forward_fraction_of_peak']:.0f}%) | {memory_text(row, 'forward_')} | {bwd} "
                     f"| {bwd_gf} | {memory_text(row, 'fwd_bwd_')} | {sp[0]} | {sp[1]} "
                     f"| {gflops_text(row['matmul_gflops'])} | {row.get('load_average_1min', '-')} |")
    paired = [p for p in result.get("paired", []) if "method" in p]
    if paired:
        lines += ["",
                  "Paired forward times (all methods on the same inputs in one process, interleaved round by round; "
                  "speedup = median of the per-round ratios; % of matmul: of a square fp32 product of side up to 2048, "
                  "% of its own matmuls: of the VQ operator's forward matmuls alone at their shapes, both measured "
                  "every round, GFLOP/s after 'of'):", "",
                  "| method | T | forward | % of matmul | % of its own matmuls | speedup vs sdpa | speedup vs full "
                  "| speedup vs sdpa-bidir | compiled vs eager | peak RSS (rise) | load | others' load (mean / max) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in paired:
            sp = [ratio_text(p["speedup"][b]) if b in p["speedup"] else "-" for b in ("sdpa", "full", "sdpa-bidir")]
            peak = (f"{100 * p['fraction_of_peak']:.0f}% of {gflops_text(p['matmul_gflops'])}"
                    if "fraction_of_peak" in p else "-")
            comp = f"{p['compile_speedup']:.2f}x" if "compile_speedup" in p else "-"
            own = (f"{100 * p['fraction_of_vq_matmuls']:.0f}% of {gflops_text(p['vq_matmuls_gflops'])}"
                   if "fraction_of_vq_matmuls" in p else "-")
            lines.append(f"| {p['method']} | {p['T']} | {_seconds(p['forward_s'])} | {peak} | {own} | {sp[0]} "
                         f"| {sp[1]} | {sp[2]} | {comp} | {memory_text(p)} "
                         f"| {p.get('load_average_1min', '-')} | {_others(p.get('others_load'))} |")
    return "\n".join(lines + [""] + machine_lines(result))


def train_table(result: dict) -> str:
    cfg, m = result["config"], result["config"]["model"]
    lines = [
        f"### Training step (forward + backward + AdamW; VQ also its codebook EMA update), {cfg['precision']}, "
        f"d_model={m['d_model']} d_k={m['d_k']} d_v={m['d_v']} n_layers={m['n_layers']} S={m['n_code']} "
        f"L={m['block_len']} batch={cfg['batch_size']}: tokens/s",
        "",
        "| model | " + " | ".join(f"T={t}" for t in cfg["lengths"]) + " |",
        "|---|" + "---:|" * len(cfg["lengths"]),
    ]
    def matrix(cell) -> list[str]:
        out = []
        for model in result["models"]:
            rows = [next((r for r in result["rows"] if r["model"] == model and r["T"] == t), None)
                    for t in cfg["lengths"]]  # None: a cell a stopped run never reached
            out.append(f"| {model} | " + " | ".join("not run" if r is None else _cell_status(r) or cell(r)
                                                    for r in rows) + " |")
        return out

    lines += matrix(lambda r: f"{r['tokens_per_s']:.0f}")
    lines += ["", "Peak memory of a step: the process's peak RSS (in brackets its rise over the step; on a GPU the "
              "CUDA allocator's peak):", "", lines[2], lines[3], *matrix(memory_text)]
    for fit in result.get("scaling", []):
        lines += ["", f"Scaling of {fit['model']} (peak memory against T by least squares; others' load: runnable "
                      "threads of other processes during the cell's steps, mean / max):", "",
                  "| T | tokens/s | peak GiB | rise GiB | peak - fit GiB | others' load |",
                  "|---:|---:|---:|---:|---:|---:|"]
        per_k, at_zero = fit["gib_per_1k_tokens"], fit["intercept_gib"]
        for r in result["rows"]:
            if r["model"] != fit["model"] or r.get("status") != "ok":
                continue
            peak = peak_gib(r)
            rise = r.get("peak_rss_rise_bytes")
            lines.append(f"| {r['T']} | {r['tokens_per_s']:,.0f} | {peak:.2f} | "
                         f"{'-' if rise is None else f'{rise / 2**30:.2f}'} | "
                         f"{peak - at_zero - per_k * r['T'] / 1024:+.2f} "
                         f"| {_others(r.get('others_load'))} |")
        lines += ["", f"{per_k:.4f} GiB per 1k tokens (1,024) + {at_zero:.2f} GiB, largest residual "
                      f"{fit['max_residual_gib']:.2f} GiB; tokens/s fastest / slowest "
                      f"{fit['tokens_per_s_max_over_min']:.2f}"]
    return "\n".join(lines + [""] + machine_lines(result))


def decode_table(result: dict) -> str:
    cfg, m = result["config"], result["config"]["model"]
    lines = [
        f"### Decoding: per-token latency of `generate` after a context of C tokens, {cfg['precision']}, "
        f"d_model={m['d_model']} n_layers={m['n_layers']} {m['head_type']} n_head={m['n_head']} S={m['n_code']} "
        f"L={m['block_len']}, median of {cfg['new_tokens']} tokens",
        "",
        "| model | context | ms / token | vs shortest context | state size | peak RSS (rise) per token "
        f"| RSS after token {cfg['new_tokens']} - after token 1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        status = _cell_status(row)
        head = f"| {row['model']} | {row['context']} |"
        if status:
            lines.append(f"{head} {status} | | | |")
            continue
        first, last = row.get("token_rss_first_bytes"), row.get("token_rss_last_bytes")
        growth = "-" if first is None or last is None else f"{(last - first) / 2**20:+.1f} MiB"
        lines.append(f"{head} {row['per_token_s'] * 1e3:.2f} | {row['latency_vs_shortest']:.2f}x "
                     f"| {row['state_bytes'] / 2**20:.2f} MiB | {memory_text(row, 'token_')} | {growth} |")
    return "\n".join(lines + ["", "Peak RSS per token: the process's peak while generating one token from that "
                                   "context (every context's state is held at once), in brackets its rise over the "
                                   "token's step."] + [""] + machine_lines(result))


def longvq_table(result: dict) -> str:
    cfg, m = result["config"], result["config"]["model"]
    # one group of ratio columns per baseline measured, the fused one first
    baselines = [b for b in LONGVQ_BASELINES if any(r["layer"] == b for r in result["rows"])]
    columns = "".join(f" fwd speedup vs {b} | fwd+bwd speedup vs {b} | memory vs {b} |" for b in baselines)
    lines = [
        f"### One LongVQ block vs one full-attention block (encoders), {cfg['precision']}, B={cfg['batch_size']} "
        f"d_model={m['d_model']} d_qk={m['d_qk']} d_v={m['d_v']} d_ffn={m['d_ffn']} ema_dim={m['ema_dim']} "
        f"S={m['n_code']} L={m['block_len']} norm={m['norm']}",
        "",
        f"| layer | T | forward | fwd tokens/s | fwd+bwd | fwd+bwd tokens/s | peak RSS (rise) |{columns} parameters "
        "| load |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (3 * len(baselines) + 2),
    ]
    ratio = {(r["layer"], r["T"], r.get("baseline", "transformer")): r for r in result.get("ratios", [])}
    for row in result["rows"]:
        status = _cell_status(row)
        head = f"| {row['layer']} | {row['T']} |"
        if status:
            lines.append(f"{head} {status} |" + " |" * (3 * len(baselines) + 6))
            continue
        bwd = (_seconds(row["fwd_bwd_s"]), f"{row['fwd_bwd_tokens_per_s']:,.0f}") if "fwd_bwd_s" in row else (
            f"skipped (est. {_seconds(row['estimated_fwd_bwd_s'])})" if row.get("estimated_fwd_bwd_s") else "-", "-")
        figures = []
        for baseline in baselines:
            r = ratio.get((row["layer"], row["T"], baseline), {})
            figures += [f"{r[k]:.2f}x" if k in r else "-" for k in ("forward_speedup", "fwd_bwd_speedup",
                                                                    "memory_fraction")]
        figures.append(f"{row['parameters']:,}")
        lines.append(f"{head} {_seconds(row['forward_s'])} | {row['forward_tokens_per_s']:,.0f} | {bwd[0]} | {bwd[1]} "
                     f"| {memory_text(row)} | {' | '.join(figures)} | {row.get('load_average_1min', '-')} |")
    scoring = ", ".join(f"{kind} with {s}" for kind, s in LONGVQ_SCORING.items())
    return "\n".join(lines + ["", f"Scoring: {scoring} (--layers decides it). "
                                  "Speedup: the baseline's time over the layer's; memory: the layer's rise of the RSS "
                                  "over the baseline's. transformer: PyTorch's fused attention (no T x T scores); "
                                  "transformer-dense: its scores built whole, the baseline of LongVQ's Table 2 (Text "
                                  "4k: 5.3x and 0.1x)."]
                     + [""] + machine_lines(result))


TABLES = {"op": op_table, "train": train_table, "decode": decode_table, "longvq": longvq_table}


def table(result: dict) -> str:
    """The markdown table of any benchmark result (what the command line prints); a result saved part way (every
    ``run_*_bench`` hands its ``progress`` callback the result after each row) says so above the table."""
    text = TABLES[result["benchmark"]](result)
    if result.get("complete", True):
        return text
    return (f"**Partial result: the run stopped after {len(result['rows'])} rows** (killed, timed out or still "
            "running; the ratios computed at the end are missing).\n\n" + text)


def plot(result: dict, path: Path) -> None:
    """PNG plot: throughput vs T (op, train, longvq; log scale) or per-token latency vs context (decode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = result["benchmark"]
    if kind == "train":  # beside tokens/s, the peak memory of a step: linear in T is the promise
        fig, (ax, mem) = plt.subplots(1, 2, figsize=(11, 4.5))
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    if kind == "op":
        series, x_key, y_label = "method", "T", "forward tokens/s (one attention layer)"
        value = lambda r: r["T"] / r["forward_s"]  # noqa: E731
    elif kind == "longvq":
        series, x_key, y_label = "layer", "T", "forward tokens/s (one block)"
        value = lambda r: r["forward_tokens_per_s"]  # noqa: E731
    elif kind == "train":
        series, x_key, y_label = "model", "T", "training tokens/s"
        value = lambda r: r["tokens_per_s"]  # noqa: E731
    else:
        series, x_key, y_label = "model", "context", "ms per generated token"
        value = lambda r: r["per_token_s"] * 1e3  # noqa: E731
    names = list(dict.fromkeys(r[series] for r in result["rows"]))
    for name in names:
        points = [(r[x_key], value(r)) for r in result["rows"] if r[series] == name and r.get("status") == "ok"]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
        if kind == "train":
            peaks = [(r["T"], peak_gib(r)) for r in result["rows"]
                     if r[series] == name and r.get("status") == "ok" and peak_gib(r) is not None]
            if peaks:
                mem.plot(*zip(*peaks), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)" if kind == "decode" else "sequence length T")
    ax.set_ylabel(y_label)
    m = result["machine"]
    ax.set_title(f"tvq bench {kind} - {m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    if kind == "train":  # on a linear axis from 0, flat tokens/s looks flat (a log axis magnifies a 9% range)
        ax.set_yscale("linear")
        ax.set_ylim(bottom=0)
        mem.set_xlabel("sequence length T")
        mem.set_ylabel("peak memory of a step (GiB)")
        mem.grid(True, alpha=0.3)
        _legend(mem)
    fig.tight_layout()
    fileio.save_png(fig, path, dpi=110)
    plt.close(fig)


def _legend(ax) -> None:
    """The legend of ``ax``, when a line was drawn (none when no cell succeeded: matplotlib would warn of it)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def write_report(result: dict, out_dir: str | Path, name: str | None = None) -> dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` (the table) and ``NAME.png`` under ``out_dir``; return their paths.

    The default name is ``<benchmark>-<date>-<cpu threads>`` so results of different days and machines sit side by side.
    """
    out_dir = output_dir(out_dir)
    if name is None:
        m = result["machine"]
        name = f"{result['benchmark']}-{m['date_utc'][:10]}-{m['hostname']}-{m['logical_cpus']}cpu"
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md", "png": out_dir / f"{name}.png"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["md"].write_text(table(result) + "\n")
    plot(result, paths["png"])
    return paths
