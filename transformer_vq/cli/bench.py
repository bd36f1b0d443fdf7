"""`tvq bench op|train|decode|longvq`: time the attention operator, training steps, decoding and the LongVQ block
against a full-attention block; write table, JSON and plot.

Each benchmark's flags are the fields of its config dataclass (``transformer_vq.bench.config``) and of the model it
nests (``--preset`` plus model fields such as ``--block-len``; the model class is the type of the config's ``model``
field: a Transformer-VQ config, or a LongVQ config with the LongVQ presets); a model flag that no cell of the benchmark
reads is refused by name. Every run prints a markdown table and writes
``NAME.json`` (machine, commit, versions and every figure), ``NAME.md`` and ``NAME.png`` to ``--out``, after every
row, so that a run stopped part way keeps its finished rows (marked partial). Lengths
accept a ``k`` suffix (``8k`` = 8192). See docs/benchmarks.md for how to read the results.
"""

from __future__ import annotations

EPILOG = """examples:
  tvq bench op                                     # the paper's GAU sizes, T = 2k .. 128k (about 15 min on 2 cores)
  tvq bench op --lengths 2k 8k --methods vq-serial sdpa --no-backward
  tvq bench op --precision bfloat16
  tvq bench train --lengths 8k 32k 128k --models vq/shga full/shga
  tvq bench decode --contexts 1k 8k 64k
  tvq bench longvq --lengths 4k                     # LongVQ block vs full-attention block (LongVQ Table 2)
"""

# benchmark -> (config class, "module:function" that runs it)
BENCHES = {
    "op": ("OpBenchConfig", "transformer_vq.bench.op:run_op_bench"),
    "train": ("TrainBenchConfig", "transformer_vq.bench.train:run_train_bench"),
    "decode": ("DecodeBenchConfig", "transformer_vq.bench.decode:run_decode_bench"),
    "longvq": ("LongVQBenchConfig", "transformer_vq.bench.longvq:run_longvq_bench"),
}


def add_parser(subparsers):
    import argparse

    from transformer_vq.bench import config
    from transformer_vq.config.flags import add_flags, add_preset_flag, file_stem, not_empty

    parser = subparsers.add_parser("bench", help="benchmark the operator, training steps, decoding and LongVQ",
                                   description=__doc__, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (class_name, _) in BENCHES.items():
        cls = getattr(config, class_name)
        sub = benches.add_parser(name, help=cls.__doc__.splitlines()[0], description=cls.__doc__)
        add_flags(sub, cls, skip=("model",))
        sub.add_argument("--out", type=not_empty, default="bench-results", metavar="DIR",
                         help="directory for NAME.json, NAME.md and NAME.png (default: bench-results)")
        sub.add_argument("--name", type=file_stem, help="file name stem (default: <bench>-<date>-<host>-<cpus>cpu)")
        model = sub.add_argument_group("model (" + cls.__dataclass_fields__["model"].metadata["help"] + ")")
        add_preset_flag(model, "the benchmark's model", config.MODEL_PRESETS[cls.model_class()])
        add_flags(model, cls.model_class(), defaults="")
    return parser


def bench_config(args):
    """The benchmark config the arguments describe: its default model (or ``--preset``) with the model flags on
    top, and the benchmark flags; a model flag the benchmark does not read is refused."""
    from transformer_vq.bench import config
    from transformer_vq.config import ConfigError
    from transformer_vq.config.flags import given

    cls = getattr(config, BENCHES[args.bench][0])
    model_cls = cls.model_class()
    model = cls.base_model(config.MODEL_PRESETS[model_cls][args.preset]) if args.preset else cls().model
    model_flags, bench_flags = given(args, model_cls), given(args, cls)
    try:
        cfg = cls(model=model.replace(**model_flags), **bench_flags)
    except ConfigError:
        # a flag no cell reads is named as that, before what the model's checks make of its value (--n-classes 0
        # would otherwise be refused for what it implies of --causal)
        cls(model=model, **bench_flags).refuse_unread(model_flags)
        raise
    cfg.refuse_unread(model_flags)  # a model flag no cell reads would change nothing: refused, not ignored
    return cfg


def run(args) -> int:
    import importlib

    from transformer_vq.bench.report import failed_cells, table, write_report
    from transformer_vq.cli.batch import batch_status
    from transformer_vq.cli.errors import check_device
    from transformer_vq.config.flags import output_dir

    cfg = bench_config(args)
    check_device(getattr(cfg, "device", "cpu"), getattr(cfg, "model", None))  # before any cell starts
    output_dir(args.out)  # likewise: a report that cannot be written is refused before the run, not after it
    module_name, function_name = BENCHES[args.bench][1].split(":")
    # the files are rewritten after every row: a run stopped part way (a timeout, a lent GPU's lease ending, Ctrl-C)
    # leaves what it measured, marked partial
    result = getattr(importlib.import_module(module_name), function_name)(
        cfg, log=print, progress=lambda partial: write_report(partial, args.out, args.name))
    print()
    print(table(result))
    paths = write_report(result, args.out, args.name)
    print()
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return batch_status(failed_cells(result), len(result["rows"]), what="cells",
                        retry="see docs/benchmarks.md for each failure; a cell skipped over --budget-s is not a "
                              "failure")
