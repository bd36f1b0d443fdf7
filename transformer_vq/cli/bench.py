"""`tvq bench op|train|decode`: time the attention operator, training steps and decoding; write table, JSON and plot.

Each benchmark's flags are the fields of its config dataclass (``transformer_vq.bench.config``). Every run prints a
markdown table and writes ``NAME.json`` (machine, commit, versions and every figure), ``NAME.md`` and ``NAME.png`` to
``--out``. Lengths accept a ``k`` suffix (``8k`` = 8192). See docs/benchmarks.md for how to read the results.
"""

from __future__ import annotations

import dataclasses

EPILOG = """examples:
  tvq bench op                                     # the paper's GAU sizes, T = 2k .. 128k (about 15 min on 2 cores)
  tvq bench op --lengths 2k 8k --methods vq-serial sdpa --no-backward
  tvq bench op --dtype bfloat16
  tvq bench train --lengths 8k 32k 128k --models vq/shga full/shga
  tvq bench decode --contexts 1k 8k 64k
"""

# benchmark -> (config class, "module:function" that runs it)
BENCHES = {
    "op": ("OpBenchConfig", "transformer_vq.bench.op:run_op_bench"),
    "train": ("TrainBenchConfig", "transformer_vq.bench.train:run_train_bench"),
    "decode": ("DecodeBenchConfig", "transformer_vq.bench.decode:run_decode_bench"),
}


def parse_length(text: str) -> int:
    """``"8k"`` -> 8192, ``"100"`` -> 100."""
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def add_parser(subparsers):
    import argparse

    from transformer_vq.bench import config
    from transformer_vq.train.config import field_docs

    parser = subparsers.add_parser("bench", help="benchmark the operator, training steps and decoding",
                                   description=__doc__, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (class_name, _) in BENCHES.items():
        cls = getattr(config, class_name)
        sub = benches.add_parser(name, help=cls.__doc__.splitlines()[0], description=cls.__doc__)
        docs = field_docs(cls)
        for field in dataclasses.fields(cls):
            flag, default = f"--{field.name.replace('_', '-')}", field.default
            helptext = f"{docs.get(field.name, '')} (default: {default})"
            if isinstance(default, bool):
                sub.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=helptext)
            elif isinstance(default, tuple):
                kind = parse_length if "int" in str(field.type) else str  # annotation: tuple[int, ...] or tuple[str, ...]
                sub.add_argument(flag, nargs="*", type=kind, default=default, metavar="V", help=helptext)
            else:
                sub.add_argument(flag, type=type(default), default=default, metavar="V", help=helptext)
        sub.add_argument("--out", default="bench-results", metavar="DIR",
                         help="directory for NAME.json, NAME.md and NAME.png (default: bench-results)")
        sub.add_argument("--name", help="file name stem (default: <bench>-<date>-<host>-<cpus>cpu)")
    return parser


def run(args) -> int:
    import importlib

    from transformer_vq.bench import config
    from transformer_vq.bench.report import table, write_report

    class_name, target = BENCHES[args.bench]
    cls = getattr(config, class_name)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        cfg = cls(**values)
    except ValueError as error:
        print(f"tvq bench {args.bench}: {error}")
        return 2
    module_name, function_name = target.split(":")
    result = getattr(importlib.import_module(module_name), function_name)(cfg, log=print)
    print()
    print(table(result))
    paths = write_report(result, args.out, args.name)
    print()
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
