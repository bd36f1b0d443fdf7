"""``tvq bench decode``: per-token latency of sampling after long contexts, VQ against full attention's KV cache.

For each model and context length C the prompt of C tokens is read (in pieces of ``prompt_chunk`` tokens with the state
carried, which gives the same state as one call), then new tokens are generated exactly as ``TransformerVQ.generate``
does (one ``model(token, state)`` call and one ``sample_next_token`` per token); the median time of one such step is
the per-token latency. The state's size (``state.nbytes()``) is reported with it: constant for VQ, ``O(C)`` for the
key/value cache of ``full``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict

import torch

from transformer_vq.bench.config import DecodeBenchConfig
from transformer_vq.bench.isolate import run_cell
from transformer_vq.bench.machine import machine_info
from transformer_vq.config import TransformerVQConfig

QUADRATIC = ("full", "flash_quad")


def model_config(cfg: DecodeBenchConfig, attn_type: str) -> TransformerVQConfig:
    """The single-head model with attention ``attn_type`` at the benchmark's sizes."""
    return TransformerVQConfig(
        vocab_size=256, d_model=cfg.d_model, d_k=cfg.d_k, d_v=cfg.d_v, n_layers=cfg.n_layers, n_code=cfg.n_code,
        block_len=cfg.block_len, attn_type=attn_type, flash_chunk_len=cfg.flash_chunk_len,
    )


@torch.no_grad()
def decode_cell(model: str, context: int, config: dict) -> dict:
    """Read ``context`` tokens, then time ``new_tokens`` generation steps (run inside a cell process)."""
    from transformer_vq.nn.model import TransformerVQ
    from transformer_vq.nn.sampling import sample_next_token

    cfg = DecodeBenchConfig(**{**config, "contexts": tuple(config["contexts"]), "models": tuple(config["models"])})
    torch.manual_seed(cfg.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    net = TransformerVQ(model_config(cfg, model)).to(dtype).eval()
    gen = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(0, 256, (1, context), generator=gen)
    start = time.perf_counter()
    out = None
    for piece in prompt.split(cfg.prompt_chunk, dim=1):
        out = net(piece, None if out is None else out.state)
    prompt_s = time.perf_counter() - start
    steps = []
    for _ in range(cfg.new_tokens):
        begin = time.perf_counter()
        token = sample_next_token(out.logits[:, -1], temperature=1.0, generator=gen)
        out = net(token[:, None], out.state)
        steps.append(time.perf_counter() - begin)
    return {"status": "ok", "per_token_s": statistics.median(steps), "step_samples": steps, "prompt_s": prompt_s,
            "state_bytes": out.state.nbytes(), "state_type": type(out.state.layers[0]).__name__}


def run_decode_bench(cfg: DecodeBenchConfig, log=print) -> dict:
    """Run every (model, context) cell; return the JSON-ready result with latency ratios to the shortest context."""
    machine = machine_info()
    rows = []
    for model in cfg.models:
        last = None  # (context, prompt_s) of the last cell that ran
        for context in cfg.contexts:
            row = {"model": model, "context": context}
            est = None
            if last is not None:
                est = last[1] * (context / last[0]) ** (2 if model in QUADRATIC else 1)
            if est is not None and est > cfg.budget_s:
                row.update(status="skipped", estimated_s=round(est, 1))
            else:
                row.update(run_cell("transformer_vq.bench.decode:decode_cell",
                                    {"model": model, "context": context, "config": asdict(cfg)},
                                    isolate=cfg.isolate, timeout_s=max(900.0, 5 * (est or 0)),
                                    mem_limit_gib=cfg.mem_limit_gib or None))
                if row.get("status") == "ok":
                    last = (context, row["prompt_s"])
            rows.append(row)
            log(_line(row))
    for model in cfg.models:
        done = [r for r in rows if r["model"] == model and r.get("status") == "ok"]
        for r in done:
            r["latency_vs_shortest"] = r["per_token_s"] / done[0]["per_token_s"]
    return {"benchmark": "decode", "config": asdict(cfg), "machine": machine, "rows": rows,
            "load_average_end": machine_info(measure_peak=False)["load_average_start"]}


def _line(row: dict) -> str:
    head = f"{row['model']:>6} context={row['context']:>7}"
    if row.get("status") == "skipped":
        return f"{head}  skipped (est. prompt {row['estimated_s']:.0f} s)"
    if row.get("status") != "ok":
        return f"{head}  {row.get('status')}: {row.get('error', '')}"
    return (f"{head}  {row['per_token_s'] * 1e3:.2f} ms/token  state {row['state_bytes'] / 2**20:.2f} MiB  "
            f"(prompt {row['prompt_s']:.1f} s)")
