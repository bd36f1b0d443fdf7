"""`tvq train`: train a language model, Transformer-VQ or (``--arch longvq``) LongVQ (with no arguments: the small
Transformer-VQ model on Shakespeare).

Every model field and every training field is a flag (``--block-len``, ``--n-code``, ``--attn-type``,
``--steps``, ``--lr``; booleans as ``--abs-pos``/``--no-abs-pos``; ``none`` for optional fields). Sources,
later ones winning: ``--preset`` (model preset, default ``small``) < ``--config`` (YAML/TOML file) <
``--set KEY=VALUE`` (any field, e.g. ``--set model.d_model=128``) < the field flags. ``--resume`` continues the
run's saved config with ``--config``, ``--set`` and the flags on top (a preset, of ``--preset`` or the file,
replaces its model fields; its training fields stay the run's unless given).
``--arch`` picks the model config class: the fields of both architectures are flags (the ones they share, such as
``--d-model``, once), and a field of the other architecture is refused by name.
Data-parallel: ``torchrun --nproc_per_node N -m transformer_vq train ...``.
"""

from __future__ import annotations


import os
import sys

MEMORY_HINT = ("use a smaller model (--preset, --d-model, --n-layers), --batch-size or --update-len (the backprop "
               "window)")

EPILOG = """examples:
  tvq train                                     # small model, Shakespeare, about 5 minutes on 2 CPU cores
  tvq train --data text --data-path notes/ --name notes --steps 2000
  tvq train --data pg19 --data-path pg19/ --data-option tokenizer=pg19-32k.model --preset pg19
  tvq train --resume auto                       # continue runs/default from its latest checkpoint
  tvq train --n-layers 4 --lr 1e-3 --precision bfloat16
  tvq train --arch longvq --preset tiny --steps 100  # LongVQ's causal language model (docs/longvq.md)
  torchrun --nproc_per_node 2 -m transformer_vq train --batch-size 16
"""


def add_parser(subparsers):
    import argparse

    from transformer_vq.config import LongVQConfig, TrainConfig, TransformerVQConfig
    from transformer_vq.config.arch import ARCHS, LM_ARCHS, LM_PRESETS
    from transformer_vq.config.fields import fields_of
    from transformer_vq.config.flags import add_flags, add_preset_flag, not_empty

    parser = subparsers.add_parser(
        "train", help="train a model (no arguments: small model on Shakespeare, ~5 min on CPU)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    presets = {name: None for arch_presets in LM_PRESETS.values() for name in arch_presets}
    add_preset_flag(parser, "small", presets, source="App. C of the paper for enwik8, pg19, imagenet64; with --arch "
                                                     "longvq: enwik8, tiny, small of docs/longvq.md")
    titles = "; ".join(f"'{a.name}': {a.title}" for a in ARCHS if a.task == "lm")
    parser.add_argument("--arch", type=_arch_name, metavar="{" + ",".join(LM_ARCHS) + "}",
                        help=f"architecture ({titles}; default: tvq, or the resumed run's)")
    parser.add_argument("--config", metavar="FILE", type=not_empty,
                        help="YAML or TOML file with arch / preset / model / train sections")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model or train field, e.g. model.d_model=128 or lr=1e-3 (repeatable)")
    parser.add_argument("--resume", nargs="?", const="auto", metavar="auto|PATH", type=not_empty,
                        help="continue from the run directory's latest complete checkpoint ('auto', the default "
                             "when the flag is given alone) or from the given run/checkpoint directory")
    add_flags(parser.add_argument_group("model fields (default: the preset's; see docs/training.md)"),
              TransformerVQConfig, defaults="")
    shared = tuple(set(fields_of(LongVQConfig)) & set(fields_of(TransformerVQConfig)))
    add_flags(parser.add_argument_group("LongVQ model fields, with --arch longvq (default: the preset's; see "
                                        "docs/longvq.md); it reads the model fields above it shares too"),
              LongVQConfig, defaults="", skip=(*shared, "n_classes"))
    add_flags(parser.add_argument_group("training fields (see docs/training.md)"), TrainConfig)
    return parser


def _arch_name(text: str) -> str:
    """The type of ``--arch``: refused while parsing unless it names an architecture."""
    import argparse

    from transformer_vq.config.arch import LM_ARCHS

    if text not in LM_ARCHS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LM_ARCHS)}, got {text!r}")
    return text


def build_config(args):
    """The run config the arguments describe. Resuming without --preset / --config continues the run's
    saved config (its config.json), with the flags and --set applied on top."""
    return _config_and_base(args)[0]


def _config_and_base(args):
    """``(the run config, the saved config of the run it continues or None)``: see :func:`build_config`."""
    import dataclasses

    from transformer_vq.config import LongVQConfig, TrainConfig, TransformerVQConfig, load_config
    from transformer_vq.config.flags import given

    values = {"model": {**given(args, TransformerVQConfig), **given(args, LongVQConfig)},
              "train": given(args, TrainConfig)}
    options = values["train"].pop("data_options", {})
    file_train = _config_file_train(args)
    base = _resume_base(args, values, file_train)
    cfg = load_config(args.preset, args.config, args.overrides, base=base, values=values, arch=args.arch)
    _check_data_named(args, values, base, file_train)
    if options:
        # on top of the options of the config file (or of the run being resumed)
        train = dataclasses.replace(cfg.train, data_options={**cfg.train.data_options, **options})
        cfg = dataclasses.replace(cfg, train=train)
    return cfg, base


def _train_sets(args) -> dict:
    """The training fields given by ``--set`` (as text)."""
    from transformer_vq.config.load import parse_override

    return {key: value for section, key, value in map(parse_override, args.overrides) if section == "train"}


def _resume_base(args, values, file_train: dict):
    """The saved config of the run being resumed (None for a new run, or a run directory without one): the starting
    point under --config, --set and the flags (a preset replaces its model fields only)."""
    from transformer_vq.config import TrainConfig
    from transformer_vq.train.checkpoint.resume import resumed_base

    if args.resume is None:
        return None
    given = {**file_train, **_train_sets(args), **values["train"]}  # later sources win
    where = {k: v for k, v in given.items() if k in ("name", "run_dir")}
    return resumed_base(args.resume, where, TrainConfig, "lm")


def _config_file_train(args) -> dict:
    """The training fields of the ``--config`` file (none without one)."""
    from pathlib import Path

    from transformer_vq.config.load import read_file

    return (read_file(Path(args.config)).get("train") or {}) if args.config is not None else {}


def _check_data_named(args, values, base, file_train: dict) -> None:
    """A data path means nothing without its corpus: refuse ``--data-path`` when no source names ``--data``."""
    from transformer_vq.config import ConfigError

    named = set(values["train"]) | set(_train_sets(args)) | set(file_train)
    if base is None and "data_path" in named and "data" not in named:
        raise ConfigError("--data-path: name the corpus it holds with --data (text for your own text file or "
                          "directory; shakespeare, enwik8, pg19, imagenet64 or gcide for a downloaded copy)")


def run_training(job, command: str):
    """``(result, exit status)`` of a training job (``job()`` runs it): status 1 with an ``error:`` line for a
    :class:`~transformer_vq.train.TrainingError`, the run's own status with the line that continues it for a run
    stopped by a signal, ``None`` when it finished (then ``result`` is the job's)."""
    from transformer_vq.cli import quiet_worker, say_error
    from transformer_vq.train import TrainingError

    try:
        result = job()
    except TrainingError as err:
        say_error(str(err), every_worker=True)  # the guard's decision, taken by all workers together
        return None, 1
    if result.exit_code:
        if not quiet_worker():  # every torchrun worker stops; one line says how to go on
            print(f"stopped at step {result.step}; continue with: {continue_command(command)} --resume auto "
                  f"--run-dir {result.run_dir}", file=sys.stderr)
        return result, result.exit_code
    return result, None


def continue_command(command: str) -> str:
    """``command`` (``tvq train``, ``tvq classify train``) as it continues this run: under torchrun, with the same
    workers, since the plain command would continue with one (and a context-parallel run refuses one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return command
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    # one machine: --standalone, as the docs start it (without it torchrun wants a rendezvous endpoint); several:
    # the user's own rendezvous flags, which this process cannot know
    nodes = f"--nnodes {world // per_node} " if world > per_node else "--standalone "
    return f"torchrun {nodes}--nproc_per_node {per_node} -m transformer_vq {command.removeprefix('tvq ')}"


def rate_text(result) -> str:
    """What the end-of-run line says of the training speed: tokens/s over the steps that trained, and apart the
    steps that compiled graphs (``--torch-compile``), whose time is mostly compilation."""
    # a resumed run at its last step trained nothing in this call: no throughput to report
    rate = f" at {result.tokens_per_s:,.0f} training tokens/s" if result.tokens_per_s is not None else ""
    steps = getattr(result, "compile_steps", 0)
    if steps:
        rate += (f" ({'' if rate else 'no rate: '}{steps} step{'s' * (steps > 1)} that compiled graphs took "
                 f"{result.compile_seconds:,.1f} s{', left out' if rate else ''})")
    return rate


def sample_hint(cfg) -> str:
    """The arguments of the suggested `tvq sample`: a prompt only where it fits the run's corpus (a speaker of
    Shakespeare's plays); other corpora (a user's own files, random bytes) get tvq sample's own neutral prompt, a
    newline, by leaving --prompt out."""
    from transformer_vq.train.lm.sample import is_image_run

    if is_image_run(cfg):
        return " --out samples/ --num-samples 4"
    return " --prompt 'ROMEO:'" if cfg.train.data == "shakespeare" else ""


def run(args) -> int:
    from transformer_vq.cli.errors import check_device
    from transformer_vq.train import train

    cfg = build_config(args)
    check_device(cfg.train.device, cfg.model)
    result, status = run_training(lambda: train(cfg, resume=args.resume), "tvq train")
    if status is not None:
        return status
    if result.validation is not None:
        words = (f", word-level perplexity {result.validation.word_perplexity:.2f}"
                 if result.validation.word_perplexity is not None else "")
        print(f"done: {result.step} steps{rate_text(result)}; validation "
              f"{result.validation.bits_per_byte:.3f} {result.validation.unit}{words}.\n"
              f"next: tvq eval --ckpt {result.run_dir}"
              + (f"  |  tvq sample --ckpt {result.run_dir}{sample_hint(cfg)}" if cfg.model.causal else ""))
    return 0
