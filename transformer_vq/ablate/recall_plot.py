"""Comparing models on the recall probe: accuracy against distance, one line per model, as a table and a PNG.

A run is a :meth:`~transformer_vq.train.lm.recall.RecallResult.to_dict` (what ``tvq eval --json`` prints under
``"recall"``, and a cell's ``recall`` in the records of ``tvq ablate --matrix recall``); a model is a label with the
runs of its seeds. Per bucket the mean accuracy over the seeds is shown,
with the lowest and highest seed (the spread) beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from transformer_vq import fileio


def bucket_means(runs: list[dict]) -> list[dict]:
    """Per distance bucket over ``runs`` (the seeds of one model): ``{"bucket", "queries", "mean", "low", "high",
    "runs"}``, the accuracies averaged over the ``runs`` that have queries in the bucket."""
    labels = max((r["buckets"] for r in runs), key=len)
    rows = []
    for index, template in enumerate(labels):
        values = [r["buckets"][index]["accuracy"] for r in runs
                  if index < len(r["buckets"]) and r["buckets"][index]["accuracy"] is not None]
        queries = sum(r["buckets"][index]["queries"] for r in runs if index < len(r["buckets"]))
        rows.append({"bucket": template["bucket"], "queries": queries, **_spread(values)})
    return rows


def comparison_table(models: dict[str, list[dict]]) -> str:
    """A markdown table: one row per distance bucket (in blocks), one column per model, mean accuracy over its
    seeds with the range in brackets; then the overall accuracy and chance."""
    names = list(models)
    per_model = {name: bucket_means(runs) for name, runs in models.items()}
    buckets = max(per_model.values(), key=len)
    lines = ["| distance (blocks) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for index, row in enumerate(buckets):
        cells = [_cell(per_model[n][index] if index < len(per_model[n]) else None) for n in names]
        lines.append(f"| {row['bucket']} | " + " | ".join(cells) + " |")
    overall = [_cell(_spread([r["accuracy"] for r in models[n]])) for n in names]
    lines.append("| all | " + " | ".join(overall) + " |")
    chance = next(iter(models.values()))[0]["chance"]
    seeds = ", ".join(f"{n}: {len(models[n])}" for n in names)
    return "\n".join(lines + ["", f"Mean answer accuracy over seeds [lowest-highest seed] ({seeds} seeds); "
                                  f"chance {chance:.1%}."])


def _spread(values: list[float]) -> dict:
    """Mean, lowest and highest of ``values`` and their number (``None`` figures when there are none)."""
    if not values:
        return {"mean": None, "low": None, "high": None, "runs": 0}
    return {"mean": float(np.mean(values)), "low": min(values), "high": max(values), "runs": len(values)}


def _cell(row: dict | None) -> str:
    if row is None or row["mean"] is None:
        return "-"
    if row["runs"] == 1:  # one seed: no range to show (two seeds that agree still show theirs)
        return f"{row['mean']:.1%}"
    return f"{row['mean']:.1%} [{row['low']:.0%}-{row['high']:.0%}]"


def plot_recall(models: dict[str, list[dict]], path: str | Path,
                title: str = "Recall accuracy against distance") -> Path:
    """Write a PNG: accuracy (mean over seeds, the seeds' range shaded) against distance bucket, one line per model,
    chance as a dashed line. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = []
    for name, runs in models.items():
        rows = bucket_means(runs)
        labels = max(labels, [r["bucket"] for r in rows], key=len)
        xs = [i for i, r in enumerate(rows) if r["mean"] is not None]
        ax.plot(xs, [rows[i]["mean"] for i in xs], marker="o", label=name)
        ax.fill_between(xs, [rows[i]["low"] for i in xs], [rows[i]["high"] for i in xs], alpha=0.15)
    chance = next(iter(models.values()))[0]["chance"]
    ax.axhline(chance, linestyle="--", color="gray", label=f"chance ({chance:.0%})")
    block_len = next(iter(models.values()))[0]["block_len"]
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(f"distance from pair to query (blocks of L = {block_len})")
    ax.set_ylabel("answer accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = fileio.save_png(fig, path, dpi=120)
    plt.close(fig)
    return path
