"""`tvq train`: train a Transformer-VQ language model (with no arguments: the small model on Shakespeare).

Configuration sources, later ones winning: ``--preset`` (model preset, default ``small``), ``--config``
(YAML/TOML file), one flag per training field (``--steps``, ``--batch-size``, ...), ``--set key=value``
(any model or training field, e.g. ``--set model.d_model=128``). Data-parallel: ``torchrun
--nproc_per_node N -m transformer_vq train ...``.
"""

from __future__ import annotations

import dataclasses
import sys

EPILOG = """examples:
  tvq train                                     # small model, Shakespeare, about 5 minutes on 2 CPU cores
  tvq train --data text --data-path notes/ --name notes --steps 2000
  tvq train --data pg19 --data-path pg19/ --data-option tokenizer=pg19-32k.model --preset pg19
  tvq train --resume auto                       # continue runs/default from its latest checkpoint
  tvq train --set model.n_layers=4 --set lr=1e-3 --precision bfloat16
  torchrun --nproc_per_node 2 -m transformer_vq train --batch-size 16
"""


# Training fields that are mappings, set by their own repeatable flag instead of one --FIELD VALUE.
MAPPING_FIELDS = ("data_options",)


def add_parser(subparsers):
    import argparse

    from transformer_vq.train.config import TrainConfig, field_docs

    parser = subparsers.add_parser(
        "train", help="train a model (no arguments: small model on Shakespeare, ~5 min on CPU)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="model preset (default: small; see transformer_vq.config.PRESETS)")
    parser.add_argument("--config", metavar="FILE", help="YAML or TOML file with preset / model / train sections")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model or train field, e.g. model.d_model=128 or lr=1e-3 (repeatable)")
    parser.add_argument("--resume", nargs="?", const="auto", metavar="auto|PATH",
                        help="continue from the run directory's latest complete checkpoint ('auto', the default "
                             "when the flag is given alone) or from the given run/checkpoint directory")
    parser.add_argument("--data-option", dest="data_options", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword option of the corpus loader, e.g. tokenizer=pg19.model or "
                             "'fractions=[0.9, 0.05, 0.05]' (repeatable; saved with the run)")
    fields = parser.add_argument_group("training fields (see docs/training.md)")
    docs = field_docs(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        if field.name in MAPPING_FIELDS:
            continue
        default = field.default
        fields.add_argument(f"--{field.name.replace('_', '-')}", dest=f"field_{field.name}", metavar="VALUE",
                            help=f"{docs.get(field.name, '')} (default: {default!r})")
    return parser


def build_config(args):
    """The run config the arguments describe. Resuming without --preset / --config continues the run's
    saved config (its config.json), with the flags and --set applied on top."""
    import json

    from transformer_vq.train.config import RunConfig, TrainConfig, load_config, parse_data_options

    flags = [f"train.{f.name}={getattr(args, 'field_' + f.name)}" for f in dataclasses.fields(TrainConfig)
             if f.name not in MAPPING_FIELDS and getattr(args, "field_" + f.name) is not None]
    overrides = flags + list(args.overrides)
    cfg = load_config(args.preset, args.config, overrides)
    if args.resume is not None and args.preset is None and args.config is None:
        saved = cfg.train.resolved_run_dir() / "config.json"
        if saved.is_file():
            cfg = load_config(None, None, overrides, base=RunConfig.from_dict(json.loads(saved.read_text())))
    if args.data_options:
        # on top of the options of the config file (or of the run being resumed)
        options = {**cfg.train.data_options, **parse_data_options(args.data_options)}
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data_options=options))
    return cfg


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user: printed without a traceback."""
    from transformer_vq.data.errors import DataError
    from transformer_vq.train import CheckpointError, ConfigError

    return (ConfigError, CheckpointError, DataError, ValueError, FileNotFoundError)


def report(err: BaseException) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2


def run(args) -> int:
    from transformer_vq.train import TrainingError, train

    try:
        cfg = build_config(args)
        result = train(cfg, resume=args.resume)
    except TrainingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except user_errors() as err:
        return report(err)
    except KeyboardInterrupt:
        return 130
    if result.exit_code:
        print(f"stopped at step {result.step}; continue with: tvq train --resume auto "
              f"--run-dir {result.run_dir}", file=sys.stderr)
        return result.exit_code
    if result.validation is not None:
        from transformer_vq.train.sample import is_image_run

        sample_hint = "--out samples/ --num-samples 4" if is_image_run(cfg) else "--prompt 'ROMEO:'"
        words = (f", word-level perplexity {result.validation.word_perplexity:.2f}"
                 if result.validation.word_perplexity is not None else "")
        print(f"done: {result.step} steps at {result.tokens_per_s:,.0f} training tokens/s; validation "
              f"{result.validation.bits_per_byte:.3f} bits per byte{words}.\n"
              f"next: tvq eval --ckpt {result.run_dir}  |  tvq sample --ckpt {result.run_dir} {sample_hint}")
    return 0
