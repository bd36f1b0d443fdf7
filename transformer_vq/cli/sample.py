"""`tvq sample`: stream text from a checkpoint, token by token through the linear-time state; for an image model
(trained on imagenet64), write sampled 64x64 images as PNG files and a grid of them. The flags are the fields of
``transformer_vq.config.SampleConfig``."""

from __future__ import annotations

import sys

MEMORY_HINT = "use fewer --num-samples (an image model's batch) or a shorter --prompt"


def add_parser(subparsers):
    from transformer_vq.config import SampleConfig
    from transformer_vq.config.flags import add_flags

    parser = subparsers.add_parser("sample", help="stream text sampled from a checkpoint", description=__doc__)
    add_flags(parser, SampleConfig)
    return parser


def run(args) -> int:
    from transformer_vq.cli.errors import check_device
    from transformer_vq.config import RunConfig, SampleConfig
    from transformer_vq.config.arch import check_serves
    from transformer_vq.config.flags import given
    from transformer_vq.train import sample
    from transformer_vq.train.checkpoint import find_checkpoint
    from transformer_vq.train.lm.sample import is_image_run, sample_images
    from transformer_vq.train.parallel.distributed import one_process

    one_process("tvq sample runs")
    cfg = SampleConfig(**given(args, SampleConfig))
    check_device(cfg.device)
    found = find_checkpoint(cfg.ckpt)
    check_serves(found.config, "sample", found.path)
    if is_image_run(RunConfig.from_dict(found.config)):
        paths = sample_images(cfg)
        print(f"wrote {len(paths) - 1} images and a grid: {paths[-1]}")
        return 0
    pieces = sample(cfg)
    # the prompt as the model read it: bytes of the command line that were not UTF-8 show as U+FFFD, as such
    # bytes sampled do (writing them as they came would fail on a UTF-8 terminal's strict encoding)
    sys.stdout.write(cfg.prompt.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace"))
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
