"""`tvq classify train | eval`: train a sequence classifier (LongVQ, or the Transformer / Transformer-VQ baselines)
on a classification dataset, and evaluate its checkpoints (docs/longvq.md, "Classification").

``train``: every training field and every model field is a flag (``--arch``, ``--data``, ``--steps``,
``--d-model``, ...); ``--preset`` picks the starting model (default ``small`` with the dataset's recipe for the arch,
where it has one: transformer_vq.config.recipes); the number of classes and the vocabulary come from the dataset.
``--resume`` continues the run's saved config with the given flags on top (``--preset`` then replaces its model
fields, and its training fields and recipe record stay the run's). ``eval``: accuracy, loss, per-class accuracy and a
confusion-matrix PNG of a split.
"""

from __future__ import annotations

import sys

MEMORY_HINT = ("use a smaller --batch-size (tvq classify train: or --eval-batch-size) or a smaller model (--preset, "
               "--d-model, --n-layers)")

EPILOG = """examples:
  tvq classify train --data digits                         # LongVQ on sequential 8x8 digits (its recipe), minutes
  tvq classify train --data digits --preset small          # the same without the recipe: the bare preset
  tvq classify train --arch transformer --data listops --data-option n_train=5000 --name lo-tf
  tvq classify train --resume auto --steps 1200            # continue runs/classify
  tvq classify eval --ckpt runs/classify/best --split test --json
"""


def add_parser(subparsers):
    import argparse

    from transformer_vq.config.flags import Parser

    parser = subparsers.add_parser("classify", help="train or evaluate a sequence classifier (LongVQ and baselines)",
                                   description=__doc__, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    jobs = parser.add_subparsers(dest="job", metavar="JOB", required=True, parser_class=Parser)
    _add_train(jobs)
    _add_eval(jobs)
    return parser


def _add_train(jobs) -> None:
    from transformer_vq.config import ClassifyTrainConfig, LongVQConfig
    from transformer_vq.config.classify import CLASSIFY_PRESETS, DEFAULT_PRESET, FROM_DATA
    from transformer_vq.config.flags import add_flags, not_empty
    from transformer_vq.config.recipes import recipes_text

    parser = jobs.add_parser("train", help="train a classifier", description=__doc__)
    parser.add_argument("--preset", choices=list(CLASSIFY_PRESETS),
                        help=f"model preset, made an encoder (--no-causal), with the training fields' defaults (with "
                             f"--resume: the run's). "
                             f"Default: {DEFAULT_PRESET} with the dataset's recipe for the arch where it has one "
                             f"({recipes_text()}; an encoder's only; your flags win; config.json records what it "
                             f"set under 'recipe')")
    parser.add_argument("--resume", nargs="?", const="auto", metavar="auto|PATH", type=not_empty,
                        help="continue from the run directory's latest complete checkpoint ('auto', the default "
                             "when the flag is given alone) or from the given run/checkpoint directory")
    add_flags(parser.add_argument_group("model fields (default: the preset's; classes and vocabulary: the "
                                        "dataset's)"), LongVQConfig, defaults="", skip=FROM_DATA)
    add_flags(parser.add_argument_group("training fields"), ClassifyTrainConfig)


def _add_eval(jobs) -> None:
    from transformer_vq.config import ClassifyEvalConfig
    from transformer_vq.config.flags import add_flags

    parser = jobs.add_parser("eval", help="evaluate a classifier: accuracy, loss, per-class accuracy, confusion "
                                          "matrix PNG", description=__doc__)
    add_flags(parser, ClassifyEvalConfig)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def build_config(args):
    """``(config, dataset)`` of the arguments; resuming continues the run's saved config under the flags (with
    ``--preset``, its training fields: the preset replaces the model's)."""
    from transformer_vq.config import ClassifyTrainConfig, LongVQConfig, classify_config
    from transformer_vq.config.fields import build
    from transformer_vq.config.flags import given
    from transformer_vq.train.checkpoint.resume import check_resume, resumed_base
    from transformer_vq.train.classify.build import load_classify_data

    model, train = given(args, LongVQConfig), given(args, ClassifyTrainConfig)
    base = None
    if args.resume is not None:
        where = {k: v for k, v in train.items() if k in ("name", "run_dir")}
        base = resumed_base(args.resume, where, ClassifyTrainConfig, "classify")
    if "data_options" in train:  # on top of the resumed run's
        train["data_options"] = {**(base.train.data_options if base else {}), **train["data_options"]}
    train_cfg = build(ClassifyTrainConfig, {**(base.train.to_dict() if base else {}), **train}, "train")
    # a resume that cannot go on (another --data, fewer --steps) is refused before the dataset is made (ListOps'
    # generator takes minutes)
    check_resume(train_cfg.resolved_run_dir(), args.resume, train_cfg)
    data = load_classify_data(train_cfg)
    cfg = classify_config(n_classes=data.n_classes, vocab_size=data.vocab_size, preset=args.preset, model=model,
                          train=train, base=base)
    return cfg, data


def run(args) -> int:
    return _train(args) if args.job == "train" else _eval(args)


def _train(args) -> int:
    from transformer_vq.cli.errors import check_device
    from transformer_vq.cli.train import run_training
    from transformer_vq.train.checkpoint import BEST_DIR
    from transformer_vq.train.classify import classify_train
    from transformer_vq.train.parallel.distributed import one_process

    one_process("tvq classify trains")  # before the dataset is read (classify_train says it too, for Python callers)
    cfg, data = build_config(args)
    check_device(cfg.train.device)
    result, status = run_training(lambda: classify_train(cfg, resume=args.resume, data=data), "tvq classify train")
    if status is not None:
        return status
    best = result.best
    print(f"done: {result.step} steps; validation accuracy {result.validation.accuracy:.4f}, loss "
          f"{result.validation.loss:.4f}; best {best['accuracy']:.4f} at step {best['step']}.\n"
          f"next: tvq classify eval --ckpt {result.run_dir / BEST_DIR} --split test")
    return 0


def _eval(args) -> int:
    import json
    from pathlib import Path

    from transformer_vq.cli.errors import check_device
    from transformer_vq.config import ClassifyEvalConfig
    from transformer_vq.config.flags import given, output_dir
    from transformer_vq.train.classify import classify_eval

    cfg = ClassifyEvalConfig(**given(args, ClassifyEvalConfig))
    check_device(cfg.device)
    if cfg.plot is not None:  # a place where the PNG cannot be written is refused by flag before the evaluation
        output_dir(Path(cfg.plot).parent, "--plot")
    result = classify_eval(cfg)
    if args.json:
        print(json.dumps({"ckpt": cfg.ckpt, **result.to_dict()}))
    else:
        names = result.class_names or [str(i) for i in range(len(result.confusion))]
        per_class = ", ".join(f"{name} {'-' if acc is None else f'{acc:.3f}'}"
                              for name, acc in zip(names, result.per_class_accuracy))
        print(f"{result.split} (step {result.step}): accuracy {result.accuracy:.4f}, loss {result.loss:.4f} over "
              f"{result.examples:,} examples\nper class: {per_class}\nconfusion matrix: {result.plot}")
    sys.stdout.flush()
    return 0
