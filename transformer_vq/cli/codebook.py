"""`tvq codebook`: codebook health of a trained model: per unit, the usage perplexity of the codes, unused and dead
codes and the largest code shares (from the checkpoint's EMA code counts), with PNG figures (usage histogram per
layer; usage perplexity and unused codes over training from the run's metrics.jsonl), also added to the run's
TensorBoard log."""

from __future__ import annotations


def add_parser(subparsers):
    from transformer_vq.config.flags import not_empty

    parser = subparsers.add_parser("codebook", help="codebook health of a checkpoint: usage perplexity, unused codes",
                                   description=__doc__)
    parser.add_argument("--ckpt", required=True, type=not_empty, metavar="RUN",
                        help="run directory (its latest checkpoint) or one checkpoints/step_* directory")
    parser.add_argument("--out", type=not_empty, metavar="DIR",
                        help="directory of the PNG figures (default: RUN/codebook)")
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                        help="do not add the figures to the run's TensorBoard log")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    return parser


def run(args) -> int:
    import json
    from pathlib import Path

    from transformer_vq.ablate.codebook import codebook_report, format_report, run_dir_of, training_curve
    from transformer_vq.ablate.codebook_plots import write_codebook_figures
    from transformer_vq.config.flags import output_dir

    if args.out:  # an --out that cannot hold the figures is refused by name, before the checkpoint is read
        output_dir(args.out)
    report = codebook_report(args.ckpt)
    run_dir = run_dir_of(report["checkpoint"])
    curve = training_curve(run_dir)
    out = Path(args.out) if args.out else run_dir / "codebook"
    paths = write_codebook_figures(report, curve, out, run_dir if args.tensorboard else None)
    if args.json:
        print(json.dumps({**report, "units": [{k: v for k, v in u.items() if k != "shares"} for u in report["units"]],
                          "figures": {k: str(v) for k, v in paths.items()}}))
    else:
        print(format_report(report))
        print("wrote " + ", ".join(map(str, paths.values())))
    return 0
