"""`tvq sample`: stream text from a checkpoint, token by token through the linear-time state; for an image model
(trained on imagenet64), write sampled 64x64 images as PNG files and a grid of them."""

from __future__ import annotations

import sys


def add_parser(subparsers):
    parser = subparsers.add_parser("sample", help="stream text sampled from a checkpoint", description=__doc__)
    parser.add_argument("--ckpt", default="runs/default",
                        help="run directory or checkpoints/step_* directory (default: runs/default)")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate (default: 500)")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature (default: 1.0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus: smallest set with this probability")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same text (default: 0)")
    parser.add_argument("--data-path", help="corpus location, for models with a corpus-specific tokenizer")
    parser.add_argument("--out", metavar="DIR",
                        help="image models: directory for sample_NNN.png and grid.png (default: RUN_DIR/samples)")
    parser.add_argument("--num-samples", type=int, default=4,
                        help="image models: images to sample, as one batch (default: 4)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    return parser


def run(args) -> int:
    from transformer_vq.cli.train import report, user_errors
    from transformer_vq.train import sample
    from transformer_vq.train.build import run_dir_of
    from transformer_vq.train.checkpoint import find_checkpoint
    from transformer_vq.train.config import RunConfig
    from transformer_vq.train.sample import is_image_run, sample_images

    try:
        checkpoint = find_checkpoint(args.ckpt)
        if is_image_run(RunConfig.from_dict(checkpoint.config)):
            out = args.out or run_dir_of(checkpoint) / "samples"
            paths = sample_images(args.ckpt, out, num_images=args.num_samples, temperature=args.temperature,
                                  top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device)
            print(f"wrote {len(paths) - 1} images and a grid: {paths[-1]}")
            return 0
        pieces = sample(args.ckpt, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, data_path=args.data_path,
                        device=args.device)
        sys.stdout.write(args.prompt)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except user_errors() as err:
        return report(err)
    except KeyboardInterrupt:
        return 130
    sys.stdout.write("\n")
    return 0
