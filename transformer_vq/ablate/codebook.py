"""Codebook health of a trained model (``tvq codebook``): how evenly each unit's codes are used.

Read from a checkpoint's quantizer buffers (:mod:`transformer_vq.nn.quantizer`): the EMA count of each code is its
running share of the keys, so ``p = ema_count / sum(ema_count)`` per codebook gives

* the usage perplexity ``exp(-sum p log p)`` (``S`` when every code is used equally, 1 when one takes every key);
* the largest code shares;
* unused codes: codes that got no key in the last codebook update (``updates_unused > 0``, the definition of the
  ``codebook_unused`` training metric), and dead codes, unused for the last ``DEAD_AFTER`` updates or more.

Over training, the run's ``metrics.jsonl`` holds ``codebook_perplexity`` and ``codebook_unused`` of every step (the
mean over units of the last update's usage).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

DEAD_AFTER = 100
"""A code unused for this many consecutive updates or more counts as dead."""
TOP = 5
"""How many of the largest code shares are reported per codebook."""


def usage(ema_count: torch.Tensor, updates_unused: torch.Tensor) -> dict:
    """The figures of one codebook from its ``[S]`` EMA counts and ``[S]`` consecutive unused updates."""
    counts = ema_count.double()
    p = counts / counts.sum()
    entropy = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum()
    shares, codes = p.sort(descending=True)
    return {"codes": int(p.numel()), "perplexity": float(entropy.exp()),
            "unused": int((updates_unused > 0).sum()), "dead": int((updates_unused >= DEAD_AFTER).sum()),
            "top_shares": [[int(c), float(s)] for c, s in zip(codes[:TOP], shares[:TOP])],
            "shares": p.tolist()}


def codebook_report(ckpt: str | Path) -> dict:
    """Per codebook of the model in ``ckpt`` (a run directory or a checkpoint, of any run whose model has VQ layers:
    the registry's architectures with the ``codebook`` command): its :func:`usage`.

    Returns ``{"checkpoint", "step", "units": [{"unit", "kind", "group", ...usage}]}``; ``unit`` is the index of the
    module that owns the codebook (a gated attention unit, two per Transformer-VQ layer; a LongVQ layer), ``kind``
    "key" or "query", ``group`` the key/value group (or query head).
    """
    from transformer_vq.config.arch import check_serves, commands_reading
    from transformer_vq.nn.quantizer import VectorQuantizer
    from transformer_vq.train.checkpoint import CheckpointError, find_checkpoint
    from transformer_vq.train.models import instantiate

    found = find_checkpoint(ckpt)
    arch = check_serves(found.config, "codebook", found.path)
    model = instantiate(arch, arch.config.from_dict(found.config["model"]))
    found.load_weights(model)
    owners, units = [], []
    for name, quantizer in model.named_modules():
        if not isinstance(quantizer, VectorQuantizer):
            continue
        owner, _, attribute = name.rpartition(".")
        if owner not in owners:
            owners.append(owner)
        for group in range(quantizer.n_group):
            units.append({"unit": owners.index(owner), "kind": "query" if attribute.startswith("query") else "key",
                          "group": group, **usage(quantizer.ema_count[group], quantizer.updates_unused[group])})
    if not units:
        raise CheckpointError(f"the model of {found.path} has no codebook (attn_type "
                              f"{found.config['model'].get('attn_type')!r}); tvq codebook reads VQ models; for this "
                              f"run use {commands_reading(arch, but='codebook')}")
    return {"checkpoint": str(found.path), "step": found.step, "units": units}


def format_report(report: dict) -> str:
    """The console table of :func:`codebook_report`."""
    lines = [f"codebooks of {report['checkpoint']} (step {report['step']}): usage perplexity of the EMA code counts, "
             f"codes unused in the last update, dead (unused >= {DEAD_AFTER} updates), largest shares",
             f"{'unit':>4} {'kind':5} {'group':>5} {'codes':>5} {'perplexity':>10} {'unused':>6} {'dead':>5}  "
             f"largest shares (code: share)"]
    for u in report["units"]:
        top = "  ".join(f"{c}: {s:.3f}" for c, s in u["top_shares"])
        lines.append(f"{u['unit']:>4} {u['kind']:5} {u['group']:>5} {u['codes']:>5} {u['perplexity']:>10.2f} "
                     f"{u['unused']:>6} {u['dead']:>5}  {top}")
    return "\n".join(lines)


def training_curve(run_dir: str | Path) -> dict:
    """``codebook_perplexity`` and ``codebook_unused`` of every logged step of a run (the later row of a step that
    was trained twice, around a resume, wins)."""
    rows = {}
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "eval" not in row and "codebook_perplexity" in row:
                rows[row["step"]] = row
    steps = sorted(rows)
    return {"steps": steps, "perplexity": [rows[s]["codebook_perplexity"] for s in steps],
            "unused": [rows[s]["codebook_unused"] for s in steps]}


def run_dir_of(checkpoint: str | Path) -> Path:
    """The run directory a checkpoint directory belongs to (``RUN/checkpoints/step_N`` or a classification run's
    ``RUN/best/step_N`` -> ``RUN``): figures go there, never into a checkpoint."""
    path = Path(checkpoint)
    return path.parent.parent if path.parent.name in ("checkpoints", "best") else path

