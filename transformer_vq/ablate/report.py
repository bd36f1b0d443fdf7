"""The report of an experiment matrix: one JSON file with every curve, a markdown table, and PNG plots.

Every figure of the table and the plots is computed from the JSON's records, so a saved JSON regenerates them
(:func:`write_outputs`). Files, under ``out`` with stem ``name``: ``NAME.json``, ``NAME.md``, ``NAME-curves.png``
(validation bpb against steps and against training seconds), ``NAME-final.png`` (final bpb per cell with the spread
over seeds), when the cells have codebooks, ``NAME-codebook.png`` (usage perplexity and unused codes over training),
and, when the cells were scored on the recall probe, ``NAME-recall.png`` (accuracy against distance; its table is in
the markdown).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from transformer_vq.ablate.recall_plot import comparison_table
from transformer_vq.bench.report import machine_lines
from transformer_vq.config.ablate import AblateConfig, Matrix, flag_words

TAIL = 10
"""Codebook figures of a cell are the mean over its last this many steps (one step's usage is noisy)."""


def command_line(cfg: AblateConfig) -> str:
    """The ``tvq ablate`` command that reruns ``cfg`` (the flags of every field that is not the matrix's default)."""
    words, defaults = ["tvq", "ablate"], AblateConfig(matrix=cfg.matrix)
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if value == getattr(defaults, field.name) or (field.name == "matrix"):
            continue
        words += flag_words(field.name, value)
    return " ".join(words[:2] + ["--matrix", cfg.matrix] + words[2:])


def summarize_cells(matrix: Matrix, records: list[dict]) -> list[dict]:
    """One row per cell: final validation bpb over seeds (mean, sample standard deviation, min, max), the ratio of the
    mean to the reference cell's, mean training seconds, and the codebook figures when the cells have codebooks."""
    rows = []
    for cell in matrix.cells:
        done = [r for r in records if r["cell"] == cell and r["status"] == "done" and r["final_bpb"] is not None]
        failed = [r for r in records if r["cell"] == cell and r["status"] != "done"]
        finals = [r["final_bpb"] for r in done]
        row = {"cell": cell, "overrides": list(matrix.cells[cell]), "seeds": [r["seed"] for r in done],
               "failed": [f"seed {r['seed']}: {r.get('error', r['status'])}" for r in failed],
               "final_bpb": finals, "mean_bpb": statistics.fmean(finals) if finals else None,
               # one seed measures no spread: None (shown '-'), not a zero nobody measured
               "std_bpb": statistics.stdev(finals) if len(finals) > 1 else None,
               "train_seconds": statistics.fmean(r["train_seconds"] for r in done) if done else None}
        if done and "codebook_perplexity" in done[0]:
            row["codebook_perplexity"] = statistics.fmean(_tail_mean(r["codebook_perplexity"]) for r in done)
            row["codebook_unused"] = statistics.fmean(_tail_mean(r["codebook_unused"]) for r in done)
        rows.append(row)
    reference = next((r["mean_bpb"] for r in rows if r["cell"] == matrix.reference), None)
    for row in rows:
        row["ratio"] = row["mean_bpb"] / reference if reference and row["mean_bpb"] is not None else None
    return rows


def _tail_mean(values: list) -> float:
    kept = [v for v in values[-TAIL:] if v is not None]
    return statistics.fmean(kept) if kept else float("nan")


def table(result: dict) -> str:
    """The markdown report: what ran, where, and one row per cell."""
    rows, codebooks = result["summary"], any("codebook_perplexity" in r for r in result["summary"])
    s = result["settings"]
    lines = [f"# tvq ablate: {result['matrix']['name']}", "", result["matrix"]["description"] + ".", "",
             f"- command: `{result['command']}`",
             f"- every cell: preset {s['preset']} with {' '.join(result['matrix']['base']) or 'no base overrides'}"
             f"{' ' + ' '.join(s['overrides']) if s['overrides'] else ''}; data {s['data']}{_options(s)}; "
             f"{s['steps']} steps of "
             f"{s['batch_size']} x {s['update_len']} tokens, sequences of {s['seq_len']} with the state carried; "
             f"seeds {' '.join(map(str, s['seeds']))}; validation bpb on {s['eval_tokens'] or 'all'} tokens",
             *machine_lines(result), "",
             "| cell | overrides | seeds | final val bpb (mean +- sd) | min .. max | ratio to "
             f"{result['matrix']['reference']} | train s |" + (" codebook ppl | unused codes |" if codebooks else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if codebooks else "")]
    for r in rows:
        if r["mean_bpb"] is None:
            lines.append(f"| {r['cell']} | {' '.join(r['overrides'])} | 0 | failed | - | - | - |"
                         + (" - | - |" if codebooks else ""))
            continue
        cb = f" {r['codebook_perplexity']:.1f} | {r['codebook_unused']:.1%} |" if "codebook_perplexity" in r else \
            (" - | - |" if codebooks else "")
        spread = "-" if r["std_bpb"] is None else f"{r['std_bpb']:.4f}"
        lines.append(f"| {r['cell']} | {' '.join(r['overrides'])} | {len(r['seeds'])} | {r['mean_bpb']:.4f} +- "
                     f"{spread} | {min(r['final_bpb']):.4f} .. {max(r['final_bpb']):.4f} | "
                     f"{_ratio(r['ratio'])} | {r['train_seconds']:.3g} |{cb}")
    failures = [f"- {r['cell']} {text}" for r in rows for text in r["failed"]]
    reused = [f"- {r['cell']} seed {r['seed']}: {r['reused_from']}" for r in result["cells"] if "reused_from" in r]
    return "\n".join(lines + (["", "Failed:", *failures] if failures else [])
                     + (["", "Identical trainings of another matrix, reused:", *reused] if reused else [])
                     + _recall_lines(result))


def _options(settings: dict) -> str:
    options = settings.get("data_options") or {}
    return f" ({' '.join(f'{k}={v}' for k, v in options.items())})" if options else ""


def recall_models(result: dict) -> dict[str, list[dict]]:
    """The recall scores of the finished cells that have one, by cell (the seeds' runs), in the records' order."""
    models = {}
    for record in result["cells"]:
        if record["status"] == "done" and "recall" in record:
            models.setdefault(record["cell"], []).append(record["recall"])
    return models


def _recall_lines(result: dict) -> list[str]:
    """The accuracy-by-distance table of the recall probe, when the cells were scored on it."""
    models = recall_models(result)
    if not models:
        return []
    first = next(iter(models.values()))[0]
    return ["", f"## Recall accuracy against distance (test split, {first['episodes']} episodes, blocks of "
                f"L = {first['block_len']})", "", comparison_table(models)]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def write_ablation_report(cfg: AblateConfig, matrix: Matrix, records: list[dict]) -> dict:
    """Assemble the result (machine, commit, versions, settings, every cell's curves, the summary) and write it."""
    from transformer_vq.bench.machine import load_average, machine_info

    machine = machine_info(measure_peak=False)
    if cfg.threads:  # the cells' threads (each cell's process applies --threads), not this process's
        machine["torch_threads"] = cfg.threads
    result = {"benchmark": "ablate", "matrix": dataclasses.asdict(matrix), "settings": cfg.to_dict(),
              "command": command_line(cfg), "machine": machine,
              "load_average_end": load_average(), "cells": records,
              "summary": summarize_cells(matrix, records)}
    result["paths"] = {k: str(v) for k, v in write_outputs(result, cfg.out, cfg.resolved_name()).items()}
    return result


def write_outputs(result: dict, out: str | Path, name: str) -> dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` and the plots of ``result`` under ``out``; return their paths."""
    from transformer_vq.ablate.plots import plot_codebook, plot_curves, plot_final
    from transformer_vq.ablate.recall_plot import plot_recall

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json", "md": out / f"{name}.md", "curves": out / f"{name}-curves.png",
             "final": out / f"{name}-final.png"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["md"].write_text(table(result) + "\n")
    plot_curves(result, paths["curves"])
    plot_final(result, paths["final"])
    if any("codebook_perplexity" in r for r in result["cells"]):
        paths["codebook"] = out / f"{name}-codebook.png"
        plot_codebook(result, paths["codebook"])
    if recall_models(result):
        paths["recall"] = plot_recall(recall_models(result), out / f"{name}-recall.png",
                                      title=f"{result['matrix']['name']}: recall accuracy against distance")
    return paths
