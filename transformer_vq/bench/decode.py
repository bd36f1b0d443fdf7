"""``tvq bench decode``: per-token latency of sampling after long contexts, VQ against full attention's KV cache.

For each model one prompt is read up to each context length C in turn (in pieces of ``prompt_chunk`` tokens with the
state carried, which gives the same state as one call), keeping the state reached at each C; then new tokens are
generated exactly as ``TransformerVQ.generate`` does (one ``model(token, state)`` call and one ``sample_next_token``
per token), one token from each context per round; the median time of one such step is the per-token latency. The
state's size (``state.nbytes()``) is reported with it: constant for VQ, ``O(C)`` for the
key/value cache of ``full``. So is the peak memory of generating one token from each context
(:mod:`transformer_vq.bench.memory`): the process's peak RSS over that context's tokens and the most one token's step
raised it (constant per token for VQ), and the RSS after its first and after its last token (``token_rss_first_bytes``,
``token_rss_last_bytes``): memory that grew with the tokens generated would show between the two.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict

import torch

from transformer_vq.bench.config import DecodeBenchConfig
from transformer_vq.bench.isolate import host_options, run_cell
from transformer_vq.bench.machine import synchronizer
from transformer_vq.bench.memory import PeakMemory, rss_bytes
from transformer_vq.bench.report import memory_text, progress_note
from transformer_vq.bench.result import finish_result, no_progress, start_result

QUADRATIC = ("full", "flash_quad")


@torch.no_grad()
def decode_cell(model: str, config: dict) -> dict:
    """Read one prompt up to each context length in turn, keeping the state reached at each; then generate from all
    of them, one token per context per round (run inside a cell process).

    Interleaving the rounds times every context under the same load, and in the same process (after the same large
    allocations), so the latency ratios between contexts measure the model, not the machine's mood. A context whose
    prompt would take longer than the budget (extrapolated from the prompt read so far) is skipped.
    """
    from transformer_vq.models.tvq.model import TransformerVQ
    from transformer_vq.nn.sampling import sample_next_token

    cfg = DecodeBenchConfig.from_dict(config)
    torch.manual_seed(cfg.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.precision]
    net = TransformerVQ(cfg.cell_model(model)).to(cfg.device, dtype).eval()
    gen = torch.Generator().manual_seed(cfg.seed)
    contexts = sorted(cfg.contexts)
    prompt = torch.randint(0, net.cfg.vocab_size, (1, contexts[-1]), generator=gen).to(cfg.device)
    gen = torch.Generator(cfg.device).manual_seed(cfg.seed)  # the sampler draws on the logits' device
    sync = synchronizer(cfg.device)  # a GPU runs asynchronously: every timer waits for its work
    power = 2 if model in QUADRATIC else 1
    outs, rows, read, prompt_s = {}, {}, 0, 0.0
    out = None
    for context in contexts:
        if read > 0 and prompt_s * (context / read) ** power > cfg.budget_s:
            rows[context] = {"status": "skipped", "estimated_s": round(prompt_s * (context / read) ** power, 1)}
            continue
        sync()
        start = time.perf_counter()
        for piece in prompt[:, read:context].split(cfg.prompt_chunk, dim=1):
            out = net(piece, None if out is None else out.state)
        sync()
        prompt_s += time.perf_counter() - start
        read = context
        outs[context] = out
        rows[context] = {"status": "ok", "prompt_s": prompt_s, "step_samples": []}
    peaks = {context: PeakMemory(cfg.device) for context in outs}  # each context's peak over its own tokens
    rss = {context: [] for context in outs}  # the process's RSS after each of the context's tokens
    for _ in range(cfg.new_tokens):
        for context, last in outs.items():
            with peaks[context]:
                sync()
                begin = time.perf_counter()
                token = sample_next_token(last.logits[:, -1], temperature=1.0, generator=gen)
                outs[context] = net(token[:, None], last.state)
                sync()
                seconds = time.perf_counter() - begin  # the peak's reading is not part of the token's time
            rows[context]["step_samples"].append(seconds)
            rss[context].append(rss_bytes())
    for context, last in outs.items():
        rows[context].update(per_token_s=statistics.median(rows[context]["step_samples"]),
                             state_bytes=last.state.nbytes(), state_type=type(last.state.layers[0]).__name__,
                             **peaks[context].figures("token_"), token_rss_first_bytes=rss[context][0],
                             token_rss_last_bytes=rss[context][-1])
    return {"status": "ok", "contexts": {str(c): r for c, r in rows.items()}}


def run_decode_bench(cfg: DecodeBenchConfig, log=print, progress=no_progress) -> dict:
    """One cell per model (all its contexts); return the JSON-ready result with latency ratios to the shortest context.
    ``progress(result)``, if given, receives the result so far (``complete`` False) after each model's cell."""
    result = start_result("decode", cfg)
    rows = result["rows"]
    for model in cfg.models:
        cell = run_cell("transformer_vq.bench.decode:decode_cell", {"model": model, "config": asdict(cfg)},
                        isolate=cfg.isolate, timeout_s=max(900.0, 10 * cfg.budget_s),
                        **host_options(cfg))
        contexts = cell.pop("contexts", None)
        for context in cfg.contexts:
            row = {"model": model, "context": context, **cell}
            if contexts is not None:
                row.update(contexts[str(context)])
            rows.append(row)
            log(_line(row))
        done = [r for r in rows if r["model"] == model and r.get("status") == "ok"]
        for r in done:
            r["latency_vs_shortest"] = r["per_token_s"] / done[0]["per_token_s"]
        progress(result)
    return finish_result(result)


def _line(row: dict) -> str:
    head = f"{row['model']:>6} context={row['context']:>7}"
    note = progress_note(row, "est. prompt {estimated_s:.0f} s")
    if note:
        return f"{head}  {note}"
    return (f"{head}  {row['per_token_s'] * 1e3:.2f} ms/token  state {row['state_bytes'] / 2**20:.2f} MiB  "
            f"peak RSS {memory_text(row, 'token_')}  (prompt {row['prompt_s']:.1f} s)")
