"""How much of each unit's attention goes beyond its two-block window, in a trained causal language model.

A query of Transformer-VQ attends the keys of its two-block window one by one and every older key through the
per-code cache; full attention attends the older keys one by one. Either way, the softmax mass on the keys older than
the window (:func:`older_mass`) is what the query takes from the distant history, and ``1 -`` it what it takes from
the window. :func:`history_mass` measures it for every attention unit of a model on whole sequences read from a fresh
state, by the history a query has (in blocks since the sequence began, buckets doubling as in
:mod:`transformer_vq.train.lm.context`); :func:`mass_profile` does it for a checkpoint on its validation split.

The mass comes from the dense formula (:func:`~transformer_vq.ops.full.naive.attention_weights`) applied to the
unit's own queries, keys (quantized, for VQ) and window bias, as the unit computes them: for VQ it is the cache's share
of the softmax exactly (the cache's per-code scores with their log-counts add up to the older keys' terms), the learned
``cache_bias`` included. ``O(T^2)`` memory per unit: a diagnostic for sequences of a few thousand tokens.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from transformer_vq.models.tvq import gau
from transformer_vq.ops.full.naive import attention_weights, window_mask
from transformer_vq.train.checkpoint.store import run_dir_of
from transformer_vq.nn.inference import evaluating
from transformer_vq.train.lm.build import build_model, load_corpus_for, model_from_checkpoint
from transformer_vq.train.lm.context import history_buckets

ATTN_TYPES = ("vq", "full")
"""The attention types measured: causal softmax attention over a window and an older history."""


def older_mass(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, *, block_len: int,
               older_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T]``: each query's softmax mass on the keys older than its two-block window (causal attention of
    ``q [B, H, T, Dk]`` over ``k [B, G, T, Dk]`` with the window bias ``bias [B, H, T, 2L]`` and ``older_bias [H]``
    on the older keys). Queries of the first two blocks have no older key: 0."""
    weights = attention_weights(q, k, bias, block_len=block_len, older_bias=older_bias)  # (B, H, T, T)
    older = ~window_mask(q.shape[2], block_len, q.device)  # (T, T); future keys have weight 0 already
    return (weights * older).sum(dim=-1)


@contextlib.contextmanager
def recording_older_mass():
    """Within the block, every call of a Transformer-VQ unit's attention also appends :func:`older_mass` of its
    inputs (``[B, H, T]``, float64) to the list it yields, in call order (unit by unit through the model)."""
    masses, attend = [], gau.attend

    def observed(cfg, q, k, v, bias, **kwargs):
        masses.append(older_mass(q.double(), k.double(), bias.double(), block_len=cfg.block_len,
                                 older_bias=kwargs.get("cache_bias")))
        return attend(cfg, q, k, v, bias, **kwargs)

    gau.attend = observed
    try:
        yield masses
    finally:
        gau.attend = attend


def check_measurable(cfg) -> None:
    """Raise ``ValueError`` unless ``cfg`` is a causal model whose units attend by softmax over a window and its
    past."""
    attn_type = getattr(cfg, "attn_type", None)
    if attn_type not in ATTN_TYPES or not getattr(cfg, "causal", False):
        raise ValueError(f"the history's mass is measured for causal Transformer-VQ models of attn_type "
                         f"{' or '.join(ATTN_TYPES)}; this one is attn_type={attn_type!r}, "
                         f"causal={getattr(cfg, 'causal', None)}")
    if getattr(cfg, "quantize_queries", False):
        raise ValueError("quantized queries attend through a code-pair table: their mass is not measured here")


def history_mass(model: torch.nn.Module, rows: torch.Tensor) -> dict:
    """Each unit's mean mass beyond its window over the queries of ``rows`` ``[B, T]`` (each row a sequence read from
    a fresh state), overall (queries with some older key: from block 2 on) and by history in blocks.

    Returns ``{"units": U, "mean": [U floats], "by_history": [{"blocks": [lo, hi], "mass": [U floats]}]}``."""
    cfg = model.cfg
    check_measurable(cfg)
    L, T = cfg.block_len, rows.shape[1]
    if T < 3 * L:
        raise ValueError(f"sequences of {T} tokens leave no query with a key older than its window (block_len {L}): "
                         f"give at least {3 * L}")
    with evaluating(model), recording_older_mass() as masses:
        model(rows)
    if not masses:
        raise ValueError(f"{type(model).__name__} ran no Transformer-VQ attention unit: nothing to measure")
    by_block = np.stack([m.mean(dim=(0, 1))[:T // L * L].view(T // L, L).mean(dim=-1).cpu().numpy()
                         for m in masses])  # (U, N): mean over batch, heads and the block's queries
    buckets = [(lo, hi) for lo, hi in history_buckets(T // L) if lo >= 2]
    return {"units": len(masses), "mean": by_block[:, 2:].mean(axis=1).tolist(),
            "by_history": [{"blocks": [lo, hi], "mass": by_block[:, lo:hi].mean(axis=1).tolist()}
                           for lo, hi in buckets if lo < T // L]}


def mass_profile(ckpt: str, *, sequences: int = 8, seq_len: int | None = None, split: str = "validation",
                 init: bool = False, device: str = "auto") -> dict:
    """:func:`history_mass` of a checkpoint on the first ``sequences`` sequences of ``seq_len`` tokens (default:
    the run's training ``seq_len``) of ``split``, with the checkpoint's step. ``init``: of a model of the same
    configuration as initialized (seeded by the run's seed), the step 0 of the comparison."""
    model, run_cfg, checkpoint = model_from_checkpoint(ckpt, device=device)
    check_measurable(run_cfg.model)
    if init:
        torch.manual_seed(run_cfg.train.seed)
        model = build_model(run_cfg).to(next(model.parameters()).device)
    seq_len = seq_len or run_cfg.train.seq_len
    tokens = load_corpus_for(run_cfg.train, run_dir=run_dir_of(checkpoint)).split(split)
    if len(tokens) < sequences * seq_len:
        raise ValueError(f"the {split} split has {len(tokens):,} tokens: fewer than {sequences} x {seq_len}")
    rows = torch.from_numpy(np.asarray(tokens[:sequences * seq_len], dtype=np.int64).reshape(sequences, seq_len))
    result = history_mass(model, rows.to(next(model.parameters()).device))
    return {"step": 0 if init else checkpoint.step, "sequences": sequences, "seq_len": seq_len, **result}
