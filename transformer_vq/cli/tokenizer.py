"""`tvq tokenizer`: train the SentencePiece BPE tokenizer for PG-19 on its training books.

The model is saved where ``tvq train --data pg19 --data-path ROOT`` looks for it (in the user
cache, named after the training files and the vocabulary size) unless ``--out`` says otherwise.
"""

from __future__ import annotations


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "tokenizer",
        help="train the SentencePiece BPE tokenizer for PG-19",
        description="Train an exact-round-trip SentencePiece BPE tokenizer on the train/ books of a PG-19 tree.",
    )
    parser.add_argument("--data", default="pg19", choices=["pg19"], help="dataset (only pg19 is tokenized)")
    parser.add_argument("--data-path", required=True, help="PG-19 root with train/, validation/ and test/ directories")
    parser.add_argument("--vocab-size", type=int, default=32000, help="number of pieces (default: 32000, as in the paper)")
    parser.add_argument("--max-sentences", type=int, default=10_000_000,
                        help="lines sampled for training, bounding memory (default: 10,000,000)")
    parser.add_argument("--out", default=None, help="where to save the .model (default: the cache, where pg19 loading finds it)")
    parser.add_argument("--cache-dir", default=None, help="cache root (default: $TVQ_CACHE_DIR or ~/.cache/transformer-vq)")
    parser.add_argument("--threads", type=int, default=None, help="trainer threads (default: all CPUs)")
    return parser


def run(args) -> int:
    import sys
    import time

    from transformer_vq.data.errors import DataError
    from transformer_vq.data.pg19 import train_pg19_tokenizer

    start = time.perf_counter()
    try:
        tokenizer = train_pg19_tokenizer(
            args.data_path, args.out, vocab_size=args.vocab_size, max_sentences=args.max_sentences,
            cache_dir=args.cache_dir, num_threads=args.threads,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"trained a {tokenizer.vocab_size}-piece BPE tokenizer in {time.perf_counter() - start:.1f}s")
    print(f"saved {tokenizer.path} (sha256 {tokenizer.sha256})")
    if args.out is None:
        print(f"next: tvq train --data pg19 --data-path {args.data_path} --preset pg19")
    else:
        print(f"use it from Python: load_corpus('pg19', data_path={args.data_path!r}, tokenizer={str(tokenizer.path)!r}); "
              f"`tvq train` finds only the default location (omit --out)")
    return 0
