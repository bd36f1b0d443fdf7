"""Where the compressive cache helps or hurts a trained checkpoint: the profile of ``transformer_vq.train.lm.context``.

    python benchmarks/cache_context.py RUN [RUN ...] [--carry -1 0] [--max-tokens 0] --name NAME [--out DIR]

For each run (a run or checkpoint directory of a language model) and each ``--carry`` (tokens of history before the
state is reset; 0 = the whole stream, -1 = the run's training seq_len), the validation bits per byte with the cache as
trained and, for a VQ model, with it off (same weights), by position in block and by history carried. Writes
``NAME.json`` (every row, the command, the machine, the commit) and ``NAME.md`` (one table row per run, cache, carry).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import file_stem, int_at_least, not_empty
from transformer_vq.train.lm.context import context_profile


def table(results: dict) -> list[str]:
    """Markdown rows: run, cache, carry, bpb, then bpb by history bucket."""
    lines = ["| run | cache | carry (tokens) | val bpb | bpb by history (blocks: bpb) |", "|---|---|---:|---:|---|"]
    for run, rows in results.items():
        for row in rows:
            by_history = ", ".join(f"{b['blocks'][0]}-{b['blocks'][1]}: {b['bpb']:.3f}" for b in row["by_history"])
            carry = row["carry_tokens"] or "whole stream"
            lines.append(f"| {run} | { {True: 'on', False: 'off', None: '-'}[row['cache']]} | {carry} "
                         f"| {row['bpb']:.4f} | {by_history} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=not_empty, nargs="+")
    parser.add_argument("--carry", type=int_at_least(-1, "0 = the whole stream, -1 = the run's seq_len"), nargs="+",
                        default=[-1, 0], help="tokens of history before the state is reset (0 = the whole stream, "
                                              "-1 = the run's training seq_len)")
    parser.add_argument("--max-tokens", type=int_at_least(0), default=0,
                        help="validation tokens read (0 = the whole split)")
    parser.add_argument("--device", type=not_empty, default="auto")
    parser.add_argument("--name", type=file_stem, required=True)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    args = parser.parse_args(argv)
    results = {run: context_profile(run, carry=tuple(args.carry), max_tokens=args.max_tokens, device=args.device)
               for run in args.runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": command_line(), "machine": machine_info(measure_peak=False),
              "results": results}
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    (out / f"{args.name}.md").write_text("\n".join([f"`{record['command']}`", "", *table(results), ""]))
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
