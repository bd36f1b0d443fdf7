"""`tvq tokenizer`: train the SentencePiece BPE tokenizer for PG-19 on its training books.

The model is saved where ``tvq train --data pg19 --data-path ROOT`` looks for it (in the user
cache, named after the training files and the vocabulary size) unless ``--out`` (a new file: an existing one is
refused) or ``--cache-dir`` says otherwise; the ``next:`` line then passes it by path, with
``--data-option tokenizer=PATH``. A ``--vocab-size`` the training text cannot reach is refused, naming the most it
can.
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
    check_paths(cfg)
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
    print(f"next: {train_command(cfg, tokenizer)}")
    return 0


def check_paths(cfg) -> None:
    """Refuse, by flag and before the training, a ``--cache-dir`` that ``--out`` makes unused, and an ``--out`` or
    ``--cache-dir`` where the model cannot be written (the shared check of every command's output directory)."""
    from pathlib import Path

    from transformer_vq.config import ConfigError
    from transformer_vq.config.flags import output_dir
    from transformer_vq.config.jobs import TokenizerConfig
    from transformer_vq.data.cache import cache_root

    if cfg.out is not None and cfg.cache_dir is not None:
        raise ConfigError("invalid TokenizerConfig: cache_dir is not used with out", [(
            "cache_dir", f"the model is saved at --out {cfg.out}, so the cache is not used; leave out one of them "
                         f"(--cache-dir saves it in the cache, where tvq train finds it)")], TokenizerConfig)
    if cfg.out is not None:
        output_dir(Path(cfg.out).parent, "--out")
    elif cfg.cache_dir is not None:
        output_dir(cache_root(cfg.cache_dir), "--cache-dir")


def train_command(cfg, tokenizer) -> str:
    """The ``tvq train`` command that trains on the tree with ``tokenizer``: chosen by its size when ``tvq train``
    finds it in the cache (it reads ``$TVQ_CACHE_DIR``; it has no ``--cache-dir``), else by its path; the model's
    ``--vocab-size`` when it is not the ``pg19`` preset's 32,000."""
    import shlex

    from transformer_vq.data.errors import DataError
    from transformer_vq.data.pg19 import DEFAULT_VOCAB_SIZE, find_tokenizer

    size = tokenizer.vocab_size
    try:  # the lookup `--data-option vocab_size=N` makes (an unwritable default cache finds nothing)
        found = find_tokenizer(cfg.data_path, size).resolve() == tokenizer.path.resolve()
    except DataError:
        found = False
    if found:
        option = f" --data-option vocab_size={size}" if size != DEFAULT_VOCAB_SIZE else ""
    else:
        option = f" --data-option tokenizer={shlex.quote(str(tokenizer.path))}"
    vocab = f" --vocab-size {size}" if size != DEFAULT_VOCAB_SIZE else ""
    return f"tvq train --data pg19 --data-path {shlex.quote(cfg.data_path)}{option} --preset pg19{vocab}"
