"""`tvq ablate`: run an experiment matrix of short trainings and write its report (docs/quality.md).

Every cell of the matrix (a named set of config overrides) is trained once per seed with the same data, steps and
batch, each in its own process and run directory under ``--work-dir``. Rerunning the same command continues a killed
matrix: finished trainings are skipped, an unfinished one resumes from its checkpoint. The report goes to ``--out``:
``NAME.json`` (machine, commit, versions, every curve), ``NAME.md`` (final validation bpb per cell, mean and spread
over seeds, ratio to the reference cell) and PNG plots. A matrix may bring its own defaults (the recall matrix: the
recall data and a smaller model) and score every cell on a probe (the recall matrix: answer accuracy against
distance, as a table in NAME.md and NAME-recall.png).
"""

from __future__ import annotations

EPILOG = """matrices:
{matrices}

examples:
  tvq ablate --matrix attention                  # gcide, 600 steps x 2 seeds per cell (hours on 2 CPU cores)
  tvq ablate --matrix codebook --steps 300 --seeds 0 1 2
  tvq ablate --matrix codebook --jobs 2 --threads 1   # two trainings at once, one thread each
  tvq ablate --matrix attention-long             # vq vs full at 8k tokens: the equal wall-clock view
  tvq ablate --matrix codebook --preset tiny --data shakespeare --steps 20 --seq-len 256 --update-len 128
  tvq ablate --matrix recall                     # the memory probe: vq, vq-window-only, full; 3000 steps x 2 seeds
  tvq ablate --matrix recall --seeds 0 --steps 8 --seq-len 128 --update-len 32 --batch-size 2 \\
      --set d_model=32 d_k=16 d_v=64 n_layers=1 n_code=8 block_len=8 warmup_steps=2 --data-option n_pairs=4 \\
      --data-option train_episodes=8 --data-option eval_episodes=4 --work-dir runs/recall-check --name recall-check
"""


def add_parser(subparsers):
    import argparse

    from transformer_vq.config.ablate import MATRICES, AblateConfig
    from transformer_vq.config.flags import add_flags

    matrices = "\n".join(f"  {m.name:14s} {m.description}" + _defaults_text(m) for m in MATRICES.values())
    parser = subparsers.add_parser("ablate", help="run an experiment matrix of short trainings (bpb per cell, plots)",
                                   description=__doc__, epilog=EPILOG.format(matrices=matrices),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, AblateConfig)
    return parser


def _defaults_text(matrix) -> str:
    """`` (defaults: --data recall --seq-len 1024 ...)``: the flags whose defaults the matrix replaces."""
    from transformer_vq.config.ablate import flag_words

    words = [word for name, value in matrix.defaults for word in flag_words(name, value)]
    return f" (defaults: {' '.join(words)})" if words else ""


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args) -> int:
    import signal

    from transformer_vq.ablate import run_ablation
    from transformer_vq.cli.batch import batch_status
    from transformer_vq.cli.errors import check_device
    from transformer_vq.config.ablate import AblateConfig
    from transformer_vq.config.flags import given
    from transformer_vq.config.fields import build

    cfg = build(AblateConfig, given(args, AblateConfig), "ablate")
    check_device(cfg.device)  # in the words of every command, before any cell
    # `kill` stops the matrix as Ctrl-C does: every running training is stopped and saves its checkpoint (the default
    # SIGTERM would end this process alone and leave its trainings running)
    signal.signal(signal.SIGTERM, _interrupt)
    result = run_ablation(cfg)
    failed = [(row["cell"], text) for row in result["summary"] for text in row["failed"]]
    print(open(result["paths"]["md"]).read())
    print("wrote " + ", ".join(result["paths"].values()))
    total = len(result["summary"]) * len(cfg.seeds)
    return batch_status(failed, total, what="trainings", retry="rerun the same command to retry them")
