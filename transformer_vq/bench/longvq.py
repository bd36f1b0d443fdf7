"""``tvq bench longvq``: one LongVQ block against one full-attention block of the same widths (LongVQ's Table 2:
"5.3x faster, 10% of the memory" on LRA Text, 4k tokens).

For each block kind and sequence length ``T`` it times the forward pass (no gradients, eval mode) and the forward +
backward pass (train mode; gradients of the weights and of the input, as for a block inside a deeper model) of ONE
block on random embeddings ``[B, T, d_model]`` with an all-real mask:

* ``longvq`` / ``longvq-relu2``: :class:`~transformer_vq.models.longvq.layer.LongVQBlock` as an encoder (bidirectional
  SSM, VQ attention over every token) with softmax / ``relu^2`` scoring; its commitment loss joins the backward pass;
* ``transformer``: :class:`~transformer_vq.models.baselines.classifiers.TransformerEncoderLayer` built from the same
  :class:`~transformer_vq.config.LongVQConfig` (heads of width ``d_qk``, FFN ``d_ffn``), quadratic attention by
  PyTorch's fused kernel (no ``T x T`` scores kept): the fair baseline, the first one every ratio is taken against;
* ``transformer-dense``: the same block with its ``T x T`` scores and weights built whole
  (:func:`~transformer_vq.models.baselines.classifiers.dense_key_masked_attention`), the "vanilla Transformer" the
  paper's 5.3x and 0.1x are taken against; ratios against it come second.

Memory is the cell's peak RSS and its rise above the RSS after the imports (see :mod:`transformer_vq.bench.isolate`):
weights, inputs and the autograd graph of the forward + backward pass. The ratios are per length and baseline: the
baseline's time over each LongVQ kind's (speed) and each LongVQ kind's rise of memory over the baseline's (memory).
A cell whose time, extrapolated from the same kind at the previous length (linearly for LongVQ, quadratically for
the transformers), exceeds the budget is skipped with its estimate.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from transformer_vq.bench.config import LONGVQ_BASELINES as BASELINES, LONGVQ_SCORING, LongVQBenchConfig
from transformer_vq.bench.isolate import budget_plan, host_options, run_cell
from transformer_vq.bench.machine import median_seconds
from transformer_vq.bench.report import memory_text, progress_note
from transformer_vq.bench.result import finish_result, no_progress, start_result
# imported with this module, so that their import is part of a cell's baseline memory, not of its peak
from transformer_vq.models.baselines.classifiers import TransformerEncoderLayer, dense_key_masked_attention
from transformer_vq.models.longvq.layer import LongVQBlock


def build_layer(kind: str, cfg: LongVQBenchConfig) -> torch.nn.Module:
    """One block of ``kind`` at the benchmark's widths, seeded by ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    if kind == "transformer":
        return TransformerEncoderLayer(cfg.model)
    if kind == "transformer-dense":
        return TransformerEncoderLayer(cfg.model, attend=dense_key_masked_attention)
    return LongVQBlock(cfg.model.replace(scoring=LONGVQ_SCORING[kind]))


def _apply(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor,
           autocast) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(output [B, T, D], commitment loss or None)`` of either block kind."""
    with autocast:
        out = layer(x, mask=mask)
    return (out, None) if isinstance(out, torch.Tensor) else (out.x, out.commit_loss)


def longvq_cell(kind: str, length: int, config: dict, repeats: int, warmup: int, backward: bool) -> dict:
    """Time one block kind at one length (run inside a cell process by ``run_cell``)."""
    cfg = LongVQBenchConfig.from_dict(config)
    layer = build_layer(kind, cfg)
    # weights stay float32 and bfloat16 runs under autocast, as in ``tvq bench train`` and in training
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bfloat16")
    generator = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.batch_size, length, cfg.model.d_model, generator=generator)
    mask = torch.ones(cfg.batch_size, length, dtype=torch.bool)
    result = {"status": "ok", "parameters": sum(p.numel() for p in layer.parameters())}
    layer.eval()
    with torch.no_grad():
        result["forward_s"], result["forward_samples"] = median_seconds(lambda: _apply(layer, x, mask, autocast),
                                                                        repeats=repeats, warmup=warmup)
    if backward:
        layer.train()
        x.requires_grad_()
        cotangent = torch.randn(x.shape, generator=generator)

        def step():
            x.grad = None
            layer.zero_grad(set_to_none=True)
            y, commit_loss = _apply(layer, x, mask, autocast)
            loss = (y.float() * cotangent).sum() + (0 if commit_loss is None else commit_loss)
            loss.backward()

        result["fwd_bwd_s"], result["fwd_bwd_samples"] = median_seconds(step, repeats=repeats, warmup=warmup)
    return result


def _estimate(kind: str, last: tuple | None, length: int) -> tuple[float | None, float | None]:
    """Forward and forward + backward seconds of ``kind`` at ``length``, from its last measured cell."""
    if last is None:
        return None, None
    scale = (length / last[0]) ** (2 if kind in BASELINES else 1)
    fwd = last[1] * scale
    return fwd, (last[2] * scale if last[2] is not None else 3 * fwd)


def _run_kind(kind: str, cfg: LongVQBenchConfig, log, rows: list[dict], saved) -> None:
    """Every length of one block kind, each cell appended to ``rows`` and ``saved()`` as it finishes."""
    last = None  # (length, forward_s, fwd_bwd_s) of the last cell that ran
    for length in cfg.lengths:
        row = {"layer": kind, "T": length}
        est_fwd, est_bwd = _estimate(kind, last, length)
        backward = budget_plan(row, est_fwd, est_bwd, cfg.budget_s, cfg.backward)
        if backward is None:
            rows.append(row)
            log(_line(row))
            saved()
            continue
        repeats, warmup = (1, 0) if est_fwd is not None and est_fwd > 5 else (cfg.repeats, 1)
        expected = ((est_fwd or 0) + (est_bwd or 0 if backward else 0)) * (repeats + warmup)
        row.update(run_cell("transformer_vq.bench.longvq:longvq_cell",
                            {"kind": kind, "length": length, "config": asdict(cfg), "repeats": repeats,
                             "warmup": warmup, "backward": backward},
                            isolate=cfg.isolate, timeout_s=max(600.0, 3 * expected),
                            **host_options(cfg)))
        if row.get("status") == "ok":
            tokens = cfg.batch_size * length
            row["forward_tokens_per_s"] = tokens / row["forward_s"]
            if "fwd_bwd_s" in row:
                row["fwd_bwd_tokens_per_s"] = tokens / row["fwd_bwd_s"]
            last = (length, row["forward_s"], row.get("fwd_bwd_s"))
        rows.append(row)
        log(_line(row))
        saved()


def ratios(rows: list[dict]) -> list[dict]:
    """Per length, LongVQ kind and measured baseline: the baseline's time over the kind's (``forward_speedup``,
    ``fwd_bwd_speedup``) and the kind's peak memory rise over the baseline's (``memory_fraction``); measured cells
    only (a figure is left out where either cell lacks it)."""
    by_key = {(r["layer"], r["T"]): r for r in rows if r.get("status") == "ok"}
    out = []
    for (kind, length), row in by_key.items():
        if kind in BASELINES:
            continue
        for baseline in BASELINES:
            base = by_key.get((baseline, length))
            if base is None:
                continue
            entry = {"layer": kind, "T": length, "baseline": baseline}
            for key in ("forward_s", "fwd_bwd_s"):
                if key in row and key in base:
                    entry[key.replace("_s", "_speedup")] = base[key] / row[key]
            if row.get("peak_rss_rise_bytes") and base.get("peak_rss_rise_bytes"):
                entry["memory_fraction"] = row["peak_rss_rise_bytes"] / base["peak_rss_rise_bytes"]
            out.append(entry)
    return out


def run_longvq_bench(cfg: LongVQBenchConfig, log=print, progress=no_progress) -> dict:
    """Run every (block kind, length) cell of ``cfg``; return the JSON-ready result with machine info and ratios.
    ``progress(result)``, if given, receives the result so far (``complete`` False) after each cell."""
    result = start_result("longvq", cfg)
    for kind in cfg.layers:
        _run_kind(kind, cfg, log, result["rows"], lambda: progress(result))
    return finish_result(result, ratios=ratios(result["rows"]))


def _line(row: dict) -> str:
    head = f"{row['layer']:>12} T={row['T']:>7}"
    note = progress_note(row, "est. forward {estimated_forward_s:.0f} s")
    if note:
        return f"{head}  {note}"
    text = f"{head}  fwd {row['forward_s']:.3f} s ({row['forward_tokens_per_s']:,.0f} tokens/s)"
    if "fwd_bwd_s" in row:
        text += f"  fwd+bwd {row['fwd_bwd_s']:.3f} s"
    return f"{text}  peak RSS {memory_text(row)}"
