"""What the carried context is worth to a trained language model: the diagnostic of the compressive cache.

A VQ model attends to its two-block window directly and to every older key through the per-code cache, whose
log-count bias grows with the history carried. :func:`context_profile` evaluates one checkpoint on a split several
ways and says where the loss comes from:

* ``carry``: the state is reset every ``carry`` tokens of a stream (0 = never, the paper's evaluation). Training
  resets it every ``seq_len`` tokens, so ``carry = seq_len`` scores the model on the history lengths it was trained
  on, and a longer carry measures whether more history helps (it should) or hurts (the model was never trained with
  so large a cache);
* ``cache``: for a VQ model with its cache, the same weights evaluated with the cache off (the window only), so the
  difference is what attending to the cache adds, for this model, at this carry;
* by position: bits per byte of the queries at each position of their block (``t mod L``; the first query of a
  block sees one block in its window, the last two) and by the history each query has (``t`` since the last reset,
  in blocks, buckets doubling: 0-2, 2-4, 4-8, ...).

Letters: S streams, W window length, L block length.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from transformer_vq.data.metrics import bits_per_byte, corpus_tokens_per_byte
from transformer_vq.train.checkpoint.store import run_dir_of
from transformer_vq.nn.inference import evaluating
from transformer_vq.train.lm.build import build_model, load_corpus_for, model_from_checkpoint
from transformer_vq.train.lm.evaluate import stream_rows, window_nll


def history_buckets(n_blocks: int) -> list[tuple[int, int]]:
    """Doubling buckets of history in blocks covering ``0 .. n_blocks``: ``(0, 2), (2, 4), (4, 8), ...``."""
    edges = [0, 2]
    while edges[-1] < n_blocks:
        edges.append(edges[-1] * 2)
    return list(zip(edges[:-1], edges[1:]))


def profile_tokens(model: torch.nn.Module, tokens: np.ndarray, *, window_len: int, block_len: int,
                   carry_tokens: int = 0, streams: int = 16, tokens_per_byte: float = 1.0,
                   precision: str = "float32") -> dict:
    """Bits per byte of ``tokens`` overall, by position in block and by history carried (see the module docstring).

    Returns ``{"bpb", "tokens", "by_phase": [L floats], "by_history": [{"blocks": [lo, hi], "bpb", "tokens"}]}``;
    a bucket without predictions is left out.
    """
    n_pred = len(tokens) - 1
    device = next(model.parameters()).device
    rows, mask = stream_rows(tokens, n_pred, streams, device, align=carry_tokens)
    piece = mask.shape[1]
    history_len = carry_tokens or piece
    buckets = history_buckets(-(-history_len // block_len))
    phase_nll, phase_n = torch.zeros(block_len, dtype=torch.float64), torch.zeros(block_len, dtype=torch.float64)
    hist_nll, hist_n = torch.zeros(len(buckets), dtype=torch.float64), torch.zeros(len(buckets), dtype=torch.float64)
    edges = torch.tensor([hi for _, hi in buckets])
    with evaluating(model):
        for start, nll, real in window_nll(model, rows, mask, window_len, precision, lambda s: s, carry_tokens):
            position = torch.arange(start, start + nll.shape[1])  # (W,) query positions in the stream
            since = position % history_len  # positions since the last reset
            weights = real.double().sum(dim=0).cpu()  # (W,) real predictions per column
            sums = (nll.double() * real).sum(dim=0).cpu()  # (W,)
            phase_nll.index_add_(0, position % block_len, sums)
            phase_n.index_add_(0, position % block_len, weights)
            bucket = torch.bucketize(since // block_len, edges, right=True)
            hist_nll.index_add_(0, bucket, sums)
            hist_n.index_add_(0, bucket, weights)
    bpb = lambda total, n: bits_per_byte(float(total) / float(n), tokens_per_byte) if n else math.nan  # noqa: E731
    return {"bpb": bpb(phase_nll.sum(), phase_n.sum()), "tokens": int(phase_n.sum()),
            "by_phase": [bpb(s, n) for s, n in zip(phase_nll, phase_n)],
            "by_history": [{"blocks": list(b), "bpb": bpb(s, n), "tokens": int(n)}
                           for b, s, n in zip(buckets, hist_nll, hist_n) if n]}


def context_profile(ckpt: str, *, carry: tuple[int, ...] = (0,), cache: tuple[bool, ...] = (True, False),
                    split: str = "validation", max_tokens: int = 0, streams: int | None = None,
                    window_len: int | None = None, device: str = "auto") -> list[dict]:
    """Profile a language-model checkpoint at every ``carry`` (0 = the whole stream; ``-1`` = the run's ``seq_len``),
    with the compressive cache as trained and, for VQ models with a cache, off (``cache`` False).

    Returns one row per (cache, carry): ``{"cache", "carry_tokens", **profile_tokens(...)}``, ``cache`` None for a
    model without one.
    """
    model, run_cfg, checkpoint = model_from_checkpoint(ckpt, device=device)
    corpus = load_corpus_for(run_cfg.train, run_dir=run_dir_of(checkpoint))
    tokens = corpus.split(split)
    tokens = tokens[:max_tokens] if max_tokens else tokens
    window = window_len or run_cfg.train.update_len
    cfg = run_cfg.model
    has_cache = getattr(cfg, "attn_type", None) == "vq" and getattr(cfg, "compressive_cache", False)
    rows = []
    for with_cache in cache if has_cache else (True,):
        if not with_cache:  # the same weights without the cache; its only parameter, a learned bias, goes with it
            off = cfg.replace(compressive_cache=False, cache_bias_init=None)
            window_only = build_model(dataclasses.replace(run_cfg, model=off))
            window_only.load_state_dict({name: value for name, value in model.state_dict().items()
                                         if not name.endswith(".cache_bias")})
            model = window_only.to(next(model.parameters()).device).eval()
        for carry_tokens in carry:
            carry_tokens = run_cfg.train.seq_len if carry_tokens == -1 else carry_tokens
            rows.append({"cache": with_cache if has_cache else None, "carry_tokens": carry_tokens, **profile_tokens(
                model, tokens, window_len=window, block_len=cfg.block_len, carry_tokens=carry_tokens,
                streams=streams or run_cfg.train.eval_streams, tokens_per_byte=corpus_tokens_per_byte(corpus, split),
                precision=run_cfg.train.precision)})
    return rows
