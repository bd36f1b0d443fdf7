"""What packed documents cost: training throughput of one batch packed with documents against the same batch unpacked.

``python -m transformer_vq.bench.packing [--device cuda] [--preset small] [--length 2048] ...`` times a training step
(forward, backward, optimizer, codebook update) of the same model on the same tokens, once as plain rows and once
with ``position_ids`` cutting each row into documents whose lengths are drawn (seeded) around each ``--mean-doc``
length, at equal tokens. The cases are timed in turn, each leading one round in turn, so a load change on a shared
machine hits them alike, and the others' load is sampled while each case runs (:mod:`transformer_vq.bench.load`:
runnable threads of other processes). Each case's peak memory is measured apart, in a fresh process per case that
runs two steps (:func:`transformer_vq.bench.isolate.run_cell`: the peak resident set size above the imports on the
CPU, the peak allocation on a GPU), so the timed cases do not share one high-water mark. It prints a table (median
step time, tokens/s, packed over unpacked, peak memory, others' load) after the machine, the commit and the
versions, and writes them as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from transformer_vq.bench.isolate import run_cell
from transformer_vq.bench.load import OthersLoad, load_summary
from transformer_vq.bench.machine import machine_info, median_seconds
from transformer_vq.bench.result import command_line
from transformer_vq.config import PRESETS


def document_positions(batch: int, length: int, mean_doc: int, seed: int = 0) -> torch.Tensor:
    """``position_ids [B, T]`` of rows packed with documents of geometric lengths of mean ``mean_doc`` (>= 1)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        pieces, used = [], 0
        while used < length:
            n = min(int(torch.empty(1).geometric_(1.0 / mean_doc, generator=gen)), length - used)
            pieces.append(torch.arange(n))
            used += n
        rows.append(torch.cat(pieces))
    return torch.stack(rows)


def training_step(preset: str, block_len: int, device: str, precision: str, seed: int):
    """One training step ``step(ids [B, T + 1], position_ids [B, T] or None)`` of a fresh model."""
    from transformer_vq.models.tvq.model import TransformerVQ

    torch.manual_seed(seed)
    net = TransformerVQ(PRESETS[preset].replace(block_len=block_len, dropsin=0.0)).to(device).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bfloat16")

    def step(ids, position_ids):
        with autocast:
            loss_mask = None if position_ids is None else torch.cat(
                [position_ids[:, 1:] != 0, torch.ones_like(position_ids[:, :1], dtype=torch.bool)], dim=1)
            out = net(ids[:, :-1], targets=ids[:, 1:], position_ids=position_ids, loss_mask=loss_mask)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        net.update_codebooks()

    return step


def peak_memory(preset: str, block_len: int, device: str, precision: str, seed: int, batch_size: int, length: int,
                mean_doc: int | None) -> dict:
    """A benchmark cell (run in its own process by :func:`run_cell`, which measures its peak memory): two training
    steps of one case."""
    step = training_step(preset, block_len, device, precision, seed)
    ids = torch.randint(0, PRESETS[preset].vocab_size, (batch_size, length + 1)).to(device)
    positions = None if mean_doc is None else document_positions(batch_size, length, mean_doc, seed).to(device)
    for _ in range(2):  # the second step holds the optimizer's moments too
        step(ids, positions)
    return {}


def run(args: argparse.Namespace) -> dict:
    """Time the unpacked step and one packed step per ``--mean-doc``; returns the result with the machine's facts."""
    step = training_step(args.preset, args.block_len, args.device, args.precision, args.seed)
    ids = torch.randint(0, PRESETS[args.preset].vocab_size, (args.batch_size, args.length + 1)).to(args.device)
    mean_docs = {"unpacked": None, **{f"packed, mean document {m}": m for m in args.mean_doc}}
    cases = {name: None if m is None else document_positions(args.batch_size, args.length, m, args.seed).to(args.device)
             for name, m in mean_docs.items()}
    for positions in cases.values():  # warm every shape before any timing
        step(ids, positions)
    rows, loads = {name: [] for name in cases}, {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each case leads a round in turn
            positions = cases[name]
            with OthersLoad() as load:
                rows[name].append(median_seconds(lambda: step(ids, positions), repeats=args.repeats, warmup=0,
                                                 device=args.device)[0])
            loads[name].extend(load.samples)
    cell = dict(preset=args.preset, block_len=args.block_len, device=args.device, precision=args.precision,
                seed=args.seed, batch_size=args.batch_size, length=args.length)
    memory = {name: run_cell("transformer_vq.bench.packing:peak_memory", {**cell, "mean_doc": m}, device=args.device)
              for name, m in mean_docs.items()}
    tokens = args.batch_size * args.length
    medians = {name: statistics.median(samples) for name, samples in rows.items()}
    result = {"command": command_line(), "machine": machine_info(), "settings": vars(args), "rows": [
        {"case": name, "step_s": medians[name], "step_s_rounds": rows[name], "tokens_per_s": tokens / medians[name],
         "relative": medians["unpacked"] / medians[name],
         "peak_bytes": memory[name].get("cuda_peak_bytes", memory[name].get("peak_rss_rise_bytes")),
         **load_summary(loads[name])} for name in rows]}
    return result


def table(result: dict) -> str:
    """The result as a text table."""
    m = result["machine"]
    lines = [f"command: {result.get('command', 'not recorded')}",
             f"commit {m.get('commit')} (dirty: {m.get('dirty')}); torch {m['torch']}; python {m['python']}; "
             f"cpu {m['cpu']} x{m['logical_cpus']}; gpus {', '.join(m['gpus']) or 'none'}",
             f"settings: {json.dumps(result['settings'], sort_keys=True)}",
             f"{'case':<32} {'step s':>10} {'tokens/s':>12} {'vs unpacked':>12} {'peak MiB':>10} "
             f"{'others (mean/max)':>18}"]
    for row in result["rows"]:
        others = f"{row['others_runnable_mean']}/{row['others_runnable_max']}"
        peak = "n/a" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:,.0f}"
        lines.append(f"{row['case']:<32} {row['step_s']:>10.4f} {row['tokens_per_s']:>12,.0f} {row['relative']:>12.3f}"
                     f" {peak:>10} {others:>18}")
    lines.append("step s: median over the rounds; peak MiB: two steps of the case alone in a fresh process (the "
                 "resident set above the imports on the CPU, the peak allocation on a GPU); others: runnable "
                 "threads of other processes while the case ran (the CPU may be shared)")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Command-line entry point: prints the table (and writes JSON with ``--out``). Every input is checked before the
    first step (one ``error:`` line, exit status 2), ``--out`` included, so that a run is not lost at its end."""
    from transformer_vq.cli.errors import check_device
    from transformer_vq.config import ConfigError
    from transformer_vq.config.flags import Parser, int_at_least

    parser = Parser(prog="python -m transformer_vq.bench.packing", description=__doc__)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--block-len", type=int_at_least(1), default=None,
                        help="block length L (default: the preset's)")
    parser.add_argument("--length", type=int_at_least(1), default=2048, help="tokens per row")
    parser.add_argument("--batch-size", type=int_at_least(1), default=4)
    parser.add_argument("--mean-doc", type=int_at_least(1), nargs="+", default=[64, 512, 2048],
                        help="mean document lengths")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int_at_least(1), default=3)
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="alternations of the cases")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        args.block_len = args.block_len or PRESETS[args.preset].block_len
        PRESETS[args.preset].replace(block_len=args.block_len)  # the model the cases build, refused now if invalid
        if len(set(args.mean_doc)) < len(args.mean_doc):
            raise ConfigError(f"--mean-doc: each length once, got {' '.join(map(str, args.mean_doc))}")
        check_device(args.device)
        _check_out(args.out)
    except ConfigError as err:
        parser.exit(2, f"error: {' '.join(str(err).split())}\n")
    result = run(args)
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _check_out(out: str | None) -> None:
    """Refuse an ``--out`` the JSON could not be written to (its directory is made here)."""
    from transformer_vq.config import ConfigError
    from transformer_vq.config.flags import output_dir

    if out is None:
        return
    if Path(out).is_dir():
        raise ConfigError(f"--out: {out} is a directory; name the JSON file to write")
    output_dir(Path(out).parent)


if __name__ == "__main__":
    raise SystemExit(main())
