"""Are identical FSDP runs' validations identical? Start ROUNDS x RUNS identical 2-worker FSDP runs (gloo, one thread
per worker), the RUNS of a round side by side so that they load the machine and each other, and compare every
validation they log bit for bit with the round's majority.

This is how a timing-dependent fault in evaluation after an optimizer step was caught and closed (docs/distributed.md,
"Validation is reproducible"): with the position table held on a (version, address) key, runs logged a
validation up to 1e-3 apart (3 of 18 in the committed run, 6 of 18 in another); held on the weights' values, none
(0 of 18, twice): benchmarks/results/fsdp-validation-repeat-2026-11-26-{before,after}.md.

    python benchmarks/fsdp_validation_repeat.py --rounds 6 --runs 3 --out benchmarks/results/NAME
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from transformer_vq.bench.machine import load_average, machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty

TRAIN = ["train", "--preset", "tiny", "--set", "seq_len=32", "--set", "update_len=16", "--set", "batch_size=4",
         "--set", "warmup_steps=5", "--set", "log_every=1000", "--set", "eval_tokens=512", "--set", "eval_streams=2",
         "--set", "sample_tokens=0", "--set", "lr=3e-3", "--set", "steps=30", "--set", "eval_every=6",
         "--set", "ckpt_every=100", "--parallel", "fsdp"]


def write_corpus(path: Path) -> Path:
    """The tests' small structured text (tests/train/trainutil.py)."""
    words = ["the", "king", "shall", "speak", "to", "thee", "of", "love", "and", "war", "my", "lord", "good", "night"]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 5)) + "." for i in range(1200)]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_round(folder: Path, runs: int, corpus: Path) -> list[list[float]]:
    """Start ``runs`` identical runs together; each one's validation losses, in step order."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for i in range(runs):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(29600 + i), "-m", "transformer_vq", *TRAIN, "--set", "data=text", "--set", f"data_path={corpus}",
                "--set", f"run_dir={folder / f'run{i}'}"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(folder / f"run{i}.err", "w"),
                                      env=env))
    for i, proc in enumerate(procs):
        if proc.wait() != 0:
            raise SystemExit(f"run {i} failed: see {folder / f'run{i}.err'}")
    return [[row["loss"] for row in map(json.loads, (folder / f"run{i}" / "metrics.jsonl").read_text().splitlines())
             if "eval" in row] for i in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int_at_least(1), default=6)
    parser.add_argument("--runs", type=int_at_least(2, "a run is compared with its round's others"), default=3,
                        help="identical runs started together per round")
    parser.add_argument("--out", type=not_empty, required=True, help="path stem: writes OUT.json and OUT.md")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(tmp) / "corpus.txt")
        for r in range(args.rounds):
            folder = Path(tmp) / f"round{r}"
            folder.mkdir()
            losses = one_round(folder, args.runs, corpus)
            load = load_average()[0]  # the machine's 1-minute load at the round's end, these runs included
            majority = collections.Counter(map(tuple, losses)).most_common(1)[0][0]
            apart = [i for i, run in enumerate(losses) if tuple(run) != majority]
            largest = max((abs(a - b) for run in losses for a, b in zip(run, majority)), default=0.0)
            rounds.append({"round": r, "losses": losses, "runs_apart": apart, "largest_difference": largest,
                           "load_average": load})
            print(f"round {r}: {len(apart)} of {args.runs} runs apart from the majority, largest difference "
                  f"{largest:.3g}, load average {load:.2f}", flush=True)
    apart = sum(len(r["runs_apart"]) for r in rounds)
    summary = f"{apart} of {args.rounds * args.runs} runs logged a validation apart from their round's majority"
    print(summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"rounds": rounds, "summary": summary, "command": command_line(),
                                                    "machine": machine_info(measure_peak=False)}, indent=1))
    lines = ["| round | runs apart | largest difference | load average at its end |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['round']} | {len(r['runs_apart'])} of {args.runs} | {r['largest_difference']:.3g} | "
              f"{r['load_average']:.2f} |" for r in rounds]
    out.with_suffix(".md").write_text(f"# FSDP validations of identical runs\n\n`{command_line()}`\n\n"
                                      + "\n".join(lines) + f"\n\n{summary}.\n")


if __name__ == "__main__":
    main()
