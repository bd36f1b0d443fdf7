"""The `tvq` command line.

Each subcommand lives in its own module of this package, which defines
``add_parser(subparsers)`` (registering its arguments) and ``run(args) -> int``, and may define ``MEMORY_HINT``, what
its own flags can do when it runs out of memory.
Modules import heavy dependencies inside ``run`` so that ``tvq --help`` stays fast. Errors are answered in
one place, :func:`main` (see ``transformer_vq.cli.errors``): a user error or an environment problem is one line
``error: ...`` and exit status 2 (under torchrun said once, :func:`say_error`), Ctrl-C is 130, a bug shows its
traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

# OpenMP threads that spin while waiting steal the cores from each other as soon as another busy process
# shares the machine (measured: a small training step ran 15x slower on 2 shared cores). Sleeping waits cost
# little on an idle machine. Must be set before torch is imported; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# How long a torchrun worker other than rank 0 waits, on an error every worker meets alike, for torchrun to stop it
# once rank 0 has said it and exited (see say_error).
QUIET_RANK_WAIT_S = 10.0

# subcommand name -> module (in the order `tvq --help` lists them)
SUBCOMMANDS = {
    "version": "transformer_vq.cli.version",
    "doctor": "transformer_vq.cli.doctor",
    "demo": "transformer_vq.cli.demo",
    "tokenizer": "transformer_vq.cli.tokenizer",
    "train": "transformer_vq.cli.train",
    "eval": "transformer_vq.cli.eval",
    "sample": "transformer_vq.cli.sample",
    "export": "transformer_vq.cli.export",
    "bench": "transformer_vq.cli.bench",
    "classify": "transformer_vq.cli.classify",
    "ablate": "transformer_vq.cli.ablate",
    "codebook": "transformer_vq.cli.codebook",
}


def build_parser():
    from transformer_vq.config.flags import Parser

    parser = Parser(
        prog="tvq",
        description="Transformer-VQ: linear-time softmax attention through vector-quantized keys.",
    )
    # the library's version from its installed metadata (torch is not imported for it); `tvq version` adds torch's
    parser.add_argument("--version", action="version", version=f"transformer-vq {installed_version()}",
                        help="print the library's version (tvq version: PyTorch's and Python's too) and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = module.add_parser(subparsers)
        sub.set_defaults(_run=module.run, _memory_hint=getattr(module, "MEMORY_HINT", None))
    return parser


def installed_version() -> str:
    """The installed distribution's version (what pip recorded), read without importing the library or torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformer-vq")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "(not installed)"


def torchrun_worker() -> bool:
    """Whether torchrun started this process, read from torchrun's own variable, not ``RANK`` alone, which other
    launchers and job schedulers set for processes each with its own log (and a ``tvq sample`` there was silent)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def quiet_worker() -> bool:
    """Whether this process is a torchrun worker other than rank 0: it leaves to rank 0 what every worker would say
    alike on torchrun's one terminal (:func:`say_error`, the line that continues a stopped run)."""
    return torchrun_worker() and os.environ.get("RANK", "0") != "0"


def say_error(line: str, *, every_worker: bool) -> None:
    """Print ``error: LINE`` for an error that ends the command. Under torchrun one that ``every_worker`` meets alike
    (a refusal of the command line, config, data, run directory or checkpoint, decided the same way by all; a
    training stopped by its guard) is rank 0's to say: the other workers wait :data:`QUIET_RANK_WAIT_S` first, in
    which torchrun stops them once rank 0 has exited (it stops every worker when one exits, so one that exited first
    cut rank 0 off unheard). A worker still running after the wait says it anyway: rank 0 did not stop, so the
    error was this worker's own. An error of the machine (a disk, memory, a GPU) may be one worker's: said at once."""
    if every_worker and quiet_worker():
        time.sleep(QUIET_RANK_WAIT_S)
    print(f"error: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    if torchrun_worker():  # torchrun killed (even by SIGKILL) stops its workers, each saving first
        from transformer_vq.train.signals import stop_with_parent

        stop_with_parent()
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside training's own handler: say so, no traceback
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout left (| head): nothing to say, to whom it would not be read
        return quiet_broken_pipe()
    except Exception as err:
        from transformer_vq.cli.errors import describe, user_error_types

        line = describe(err, args._memory_hint)
        if line is None:
            raise  # a bug: its traceback is what helps
        say_error(line, every_worker=isinstance(err, user_error_types()))
        return 2


def quiet_broken_pipe() -> int:
    """Exit status 141 (128 + SIGPIPE, a shell's own for a closed pipe) after the reader of stdout went away: stdout is
    pointed at ``/dev/null`` first, so that Python's flush at exit does not fail on the same pipe with a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
