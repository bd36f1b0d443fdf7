"""`tvq eval`: loss and bits per byte (and word-level perplexity on PG-19) of a checkpoint on a split, the state
carried within each sequence of the run's seq_len (``--carry-tokens 0``: across whole streams); on the recall probe
(``--data recall``) also the answer accuracy by distance. An encoder (a ``--no-causal`` run) is scored on masked
tokens of independent windows of ``--window-len`` tokens: its context, so for an encoder, unlike a causal model, the
window length changes the score; it carries no state, so ``--carry-tokens`` is refused. The flags are the fields of
``transformer_vq.config.EvalConfig``."""

from __future__ import annotations

import sys

MEMORY_HINT = "use a smaller --window-len or fewer --streams"


def add_parser(subparsers):
    from transformer_vq.config import EvalConfig
    from transformer_vq.config.flags import add_flags

    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: loss, bits per byte, tokens/s",
                                   description=__doc__)
    add_flags(parser, EvalConfig)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def run(args) -> int:
    import json

    from transformer_vq.cli.errors import check_device
    from transformer_vq.config import EvalConfig
    from transformer_vq.config.flags import given
    from transformer_vq.train import evaluate
    from transformer_vq.train.parallel.distributed import one_process

    one_process("tvq eval runs")
    cfg = EvalConfig(**given(args, EvalConfig))
    check_device(cfg.device)
    result = evaluate(cfg)
    if args.json:
        print(json.dumps({"ckpt": cfg.ckpt, **result.to_dict()}))
    else:
        print(f"{result.split}: loss {result.loss:.4f} nats/token, {result.bits_per_byte:.3f} {result.unit} "
              f"over {result.tokens:,} tokens ({result.tokens_per_s:,.0f} tokens/s)"
              + (f", word-level perplexity {result.word_perplexity:.2f}" if result.word_perplexity is not None
                 else "")
              + (f"; state reset every {result.carry_tokens:,} tokens" if result.carry_tokens else ""))
        if result.recall is not None:
            from transformer_vq.train.lm.recall import recall_table

            print(recall_table(result.recall))
    sys.stdout.flush()
    return 0
