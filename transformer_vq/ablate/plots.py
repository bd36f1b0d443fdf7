"""The PNG plots of an experiment matrix, drawn from its result dict (transformer_vq.ablate.report)."""

from __future__ import annotations

import statistics
from pathlib import Path

from transformer_vq import fileio


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_cell(result: dict) -> dict[str, list[dict]]:
    """The finished records of each cell, in the matrix's order."""
    done = {cell: [] for cell in result["matrix"]["cells"]}
    for record in result["cells"]:
        if record["status"] == "done":
            done[record["cell"]].append(record)
    return {cell: records for cell, records in done.items() if records}


def mean_validation_curve(records: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """Steps, mean training seconds and mean validation bpb over seeds, at the steps every seed validated."""
    common = sorted(set.intersection(*({v["step"] for v in r["validation"]} for r in records)))
    rows = [{v["step"]: v for v in r["validation"]} for r in records]
    seconds = [statistics.fmean(row[s]["seconds"] for row in rows) for s in common]
    return common, seconds, [statistics.fmean(row[s]["bits_per_byte"] for row in rows) for s in common]


def _title(result: dict) -> str:
    s = result["settings"]
    return (f"tvq ablate {result['matrix']['name']}: {s['data']}, {s['steps']} steps, seq {s['seq_len']}, "
            f"seeds {len(s['seeds'])}")


def plot_curves(result: dict, path: Path) -> None:
    """Validation bpb against optimizer steps (left) and against training seconds (right: equal wall-clock)."""
    plt = _pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for cell, records in _by_cell(result).items():
        steps, seconds, bpb = mean_validation_curve(records)
        by_step.plot(steps, bpb, marker="o", markersize=3, label=cell)
        by_time.plot(seconds, bpb, marker="o", markersize=3, label=cell)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("training seconds (sum of step times, mean over seeds)")
    by_step.set_ylabel("validation bits per byte (mean over seeds)")
    _save_panels(plt, fig, (by_step, by_time), result, path)


def _save_panels(plt, fig, axes, result: dict, path: Path) -> None:
    """Grid on every panel, the legend on the first, the matrix as title; write the PNG."""
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(_title(result), fontsize=9)
    fig.tight_layout()
    fileio.save_png(fig, path, dpi=110)
    plt.close(fig)


def plot_final(result: dict, path: Path) -> None:
    """Final validation bpb per cell: the mean over seeds, the standard deviation as error bars, each seed a dot."""
    plt = _pyplot()
    rows = [r for r in result["summary"] if r["mean_bpb"] is not None]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(rows) + 2), 4.5))
    x = range(len(rows))
    ax.bar(x, [r["mean_bpb"] for r in rows], yerr=[r["std_bpb"] or 0.0 for r in rows], capsize=5, alpha=0.6)
    for i, r in enumerate(rows):
        ax.scatter([i] * len(r["final_bpb"]), r["final_bpb"], color="black", s=10, zorder=3)
    ax.set_xticks(list(x), [r["cell"] for r in rows])
    finals = [v for r in rows for v in r["final_bpb"]]
    if finals:  # the differences are small next to the bpb itself: zoom on them
        span = max(finals) - min(finals) or 0.01
        ax.set_ylim(min(finals) - span, max(finals) + span)
    ax.set_ylabel("final validation bits per byte")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(_title(result), fontsize=9)
    fig.tight_layout()
    fileio.save_png(fig, path, dpi=110)
    plt.close(fig)


def plot_codebook(result: dict, path: Path) -> None:
    """Codebook usage perplexity and fraction of unused codes per training step (mean over seeds and units)."""
    plt = _pyplot()
    fig, (ppl, unused) = plt.subplots(1, 2, figsize=(11, 4.5))
    for cell, records in _by_cell(result).items():
        if "codebook_perplexity" not in records[0]:
            continue
        steps = records[0]["steps"]
        for ax, key in ((ppl, "codebook_perplexity"), (unused, "codebook_unused")):
            values = [statistics.fmean(v for v in column if v is not None) if any(v is not None for v in column)
                      else float("nan") for column in zip(*(r[key] for r in records))]
            ax.plot(steps[:len(values)], values, label=cell, linewidth=1)
    ppl.set_ylabel("codebook usage perplexity")
    unused.set_ylabel("fraction of codes unused in the step")
    for ax in (ppl, unused):
        ax.set_xlabel("optimizer step")
    _save_panels(plt, fig, (ppl, unused), result, path)
