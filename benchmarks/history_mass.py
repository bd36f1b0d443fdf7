"""How much of each attention unit's softmax goes beyond its two-block window, for trained language models:
:mod:`transformer_vq.train.lm.history_mass`, by the history a query has.

    python benchmarks/history_mass.py --run LABEL RUN [--run ...] [--init LABEL RUN] [--sequences 8] \
        --name NAME [--out benchmarks/results] [--note KEY=TEXT ...]

Each ``--run LABEL RUN`` is a run or checkpoint directory of a causal VQ or full-attention model, measured on the
first ``--sequences`` validation sequences of its training ``seq_len``; ``--init LABEL RUN`` measures an untrained
model of that run's configuration (its seed) instead. Writes ``NAME.json`` (per run: the mean per unit and the mass by
history), ``NAME.md`` (one row per run and unit) and ``NAME.png`` (a panel per unit: the mean mass against the
training step, a line per label). None of the figures is a timing.
"""

from __future__ import annotations

import argparse

from result_files import add_output_args, notes_of, publish, save_figure

from transformer_vq.bench.machine import machine_info
from transformer_vq.config.flags import int_at_least, not_empty
from transformer_vq.train.lm.history_mass import mass_profile


def collect(runs: list[list[str]], inits: list[list[str]], sequences: int, notes: dict) -> dict:
    measured = [{"label": label, "run": run, **mass_profile(run, sequences=sequences, init=True, device="cpu")}
                for label, run in inits]
    measured += [{"label": label, "run": run, **mass_profile(run, sequences=sequences, device="cpu")}
                 for label, run in runs]
    return {"benchmark": "history-mass", "runs": measured, "notes": notes, "machine": machine_info(measure_peak=False)}


def table(result: dict) -> str:
    buckets = [f"{b['blocks'][0]}-{b['blocks'][1]}" for b in result["runs"][0]["by_history"]]
    lines = ["| run | step | unit | all queries past block 2 | " + " | ".join(f"{b} blocks" for b in buckets) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(buckets)]
    for run in result["runs"]:
        for unit in range(run["units"]):
            by = {f"{b['blocks'][0]}-{b['blocks'][1]}": b["mass"][unit] for b in run["by_history"]}
            cells = " | ".join(f"{by[b]:.1%}" if b in by else "-" for b in buckets)
            lines.append(f"| {run['label']} | {run['step']} | {unit} | **{run['mean'][unit]:.1%}** | {cells} |")
    notes = [f"- {key}: {text}" for key, text in result["notes"].items()]
    machine = result["machine"]
    return "\n".join([f"# {result['name']}", "", "Softmax mass on keys older than the query's two-block window (VQ: "
                      "the cache's share), mean over the queries of the first validation sequences read from a "
                      "fresh state, by the query's history in blocks.", "", *lines, "",
                      "Runs: " + "; ".join(f"{r['label']}: {r['run']}" for r in result["runs"]), "", *notes, "",
                      f"Machine: {machine['cpu']}, torch {machine['torch']}, commit {machine['commit']}. "
                      "None of the figures here is a timing.", ""])


def plot(result: dict, path):
    """A panel per unit: the mean mass beyond the window (queries past block 2) against the training step, a line
    per label through its checkpoints (an ``--init`` of the same label is its step 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = max(run["units"] for run in result["runs"])
    fig, axes = plt.subplots(1, units, figsize=(3.2 * units, 3.4), sharey=True, squeeze=False)
    labels = list(dict.fromkeys(run["label"] for run in result["runs"]))
    for i, label in enumerate(labels):
        runs = sorted((run for run in result["runs"] if run["label"] == label), key=lambda run: run["step"])
        for unit in range(units):
            points = [(run["step"], run["mean"][unit]) for run in runs if unit < run["units"]]
            axes[0, unit].plot(*zip(*points), marker="o", color=plt.cm.tab10(i % 10),
                               linestyle="-" if i < 10 else "--", label=label)
    for unit, ax in enumerate(axes[0]):
        ax.set_title(f"unit {unit}", fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("mass beyond the window (mean)")
    axes[0, -1].legend(fontsize=6)
    fig.suptitle(result["name"], fontsize=9)
    return save_figure(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=not_empty, nargs=2, action="append", default=[], metavar=("LABEL", "RUN"))
    parser.add_argument("--init", type=not_empty, nargs=2, action="append", default=[], metavar=("LABEL", "RUN"))
    parser.add_argument("--sequences", type=int_at_least(1), default=8)
    add_output_args(parser)
    args = parser.parse_args(argv)
    if not args.run and not args.init:
        parser.error("give at least one --run or --init")
    result = {"name": args.name, **collect(args.run, args.init, args.sequences, notes_of(args))}
    publish(result, table(result), args, plot)


if __name__ == "__main__":
    main()
