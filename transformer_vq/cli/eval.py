"""`tvq eval`: loss and bits per byte (and word-level perplexity on PG-19) of a checkpoint on a split, the state
carried across the split."""

from __future__ import annotations

import sys


def add_parser(subparsers):
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: loss, bits per byte, tokens/s",
                                   description=__doc__)
    parser.add_argument("--ckpt", default="runs/default",
                        help="run directory or checkpoints/step_* directory (default: runs/default)")
    parser.add_argument("--split", default="validation", help="split to evaluate (default: validation)")
    parser.add_argument("--data-path", help="where the corpus is, when not where training found it")
    parser.add_argument("--data-option", dest="data_options", action="append", default=[], metavar="KEY=VALUE",
                        help="override a corpus loader option saved with the run, e.g. tokenizer=other.model "
                             "(repeatable)")
    parser.add_argument("--streams", type=int,
                        help="contiguous pieces of the split evaluated side by side (default: the run's "
                             "eval_streams; 1 = the whole split as one sequence)")
    parser.add_argument("--max-tokens", type=int, default=0, help="evaluate only the first N tokens (0 = all)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def run(args) -> int:
    import json

    from transformer_vq.cli.train import report, user_errors
    from transformer_vq.train import evaluate
    from transformer_vq.train.config import parse_data_options

    try:
        result = evaluate(args.ckpt, split=args.split, data_path=args.data_path, streams=args.streams,
                          max_tokens=args.max_tokens, device=args.device,
                          data_options=parse_data_options(args.data_options))
    except (*user_errors(), KeyError) as err:
        return report(err)
    if args.json:
        print(json.dumps({"ckpt": args.ckpt, **result.to_dict()}))
    else:
        print(f"{result.split}: loss {result.loss:.4f} nats/token, {result.bits_per_byte:.3f} bits per byte "
              f"over {result.tokens:,} tokens ({result.tokens_per_s:,.0f} tokens/s)"
              + (f", word-level perplexity {result.word_perplexity:.2f}" if result.word_perplexity is not None
                 else ""))
    sys.stdout.flush()
    return 0
