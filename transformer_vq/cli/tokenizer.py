"""`tvq tokenizer`: train the SentencePiece BPE tokenizer for PG-19 on its training books.

The model is saved where ``tvq train --data pg19 --data-path ROOT`` looks for it (in the user
cache, named after the training files and the vocabulary size) unless ``--out`` says otherwise.
"""

from __future__ import annotations


def add_parser(subparsers):
    from transformer_vq.config.flags import add_flags
    from transformer_vq.config.jobs import TokenizerConfig

    parser = subparsers.add_parser(
        "tokenizer",
        help="train the SentencePiece BPE tokenizer for PG-19",
        description="Train an exact-round-trip SentencePiece BPE tokenizer on the train/ books of a PG-19 tree.",
    )
    parser.add_argument("--data", default="pg19", choices=["pg19"], help="dataset (only pg19 is tokenized)")
    add_flags(parser, TokenizerConfig)
    return parser


def run(args) -> int:
    import sys
    import time

    from transformer_vq.config.flags import given
    from transformer_vq.config.jobs import TokenizerConfig
    from transformer_vq.data.errors import DataError
    from transformer_vq.data.pg19 import train_pg19_tokenizer

    cfg = TokenizerConfig(**given(args, TokenizerConfig))
    start = time.perf_counter()
    try:
        tokenizer = train_pg19_tokenizer(
            cfg.data_path, cfg.out, vocab_size=cfg.vocab_size, max_sentences=cfg.max_sentences,
            cache_dir=cfg.cache_dir, num_threads=cfg.threads,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"trained a {tokenizer.vocab_size}-piece BPE tokenizer in {time.perf_counter() - start:.1f}s")
    print(f"saved {tokenizer.path} (sha256 {tokenizer.sha256})")
    if cfg.out is None:
        print(f"next: tvq train --data pg19 --data-path {cfg.data_path} --preset pg19")
    else:
        print(f"use it from Python: load_corpus('pg19', data_path={cfg.data_path!r}, "
              f"tokenizer={str(tokenizer.path)!r}); `tvq train` finds only the default location (omit --out)")
    return 0
