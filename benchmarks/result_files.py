"""Where a benchmark script leaves its result: ``NAME.json`` (everything it measured) and ``NAME.md`` (the table a
reader reads) under one folder, the table also printed. One writer for every script in this folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import file_stem, not_empty


def write_result(result: dict, text: str, out: str | Path, name: str) -> Path:
    """Print the table ``text`` and write ``NAME.json`` (``result``, with the command that ran the script unless it
    names one) and ``NAME.md`` (``text``, and that command where the text does not show it) under ``out`` (made if
    missing; each file written whole or not at all). Returns the folder."""
    print(text)
    result = {"command": command_line(), **result}
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    fileio.atomic_write_text(folder / f"{name}.json", json.dumps(result, indent=2) + "\n")
    command = "" if result["command"] in text else f"\nCommand: `{result['command']}`\n"
    fileio.atomic_write_text(folder / f"{name}.md", f"{text.rstrip()}\n{command}")
    print(f"wrote {folder / name}.json and .md")
    return folder


def save_figure(fig, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (the folder's figures share one resolution) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def add_output_args(parser) -> None:
    """The flags of a script that writes one result: ``--name``, ``--out`` and ``--note KEY=TEXT`` (repeatable)."""
    parser.add_argument("--name", type=file_stem, required=True)
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--note", type=note, action="append", default=[], metavar="KEY=TEXT")


def note(text: str) -> tuple[str, str]:
    """The type of ``--note``: ``KEY=TEXT`` as ``(KEY, TEXT)``, both stripped (``KEY = TEXT`` is ``KEY=TEXT``),
    refused while parsing without a key."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=TEXT, got {text!r}")
    return key.strip(), value.strip()


def notes_of(args) -> dict:
    """``--note KEY=TEXT`` flags as ``{KEY: TEXT}``."""
    return dict(args.note)


def publish(result: dict, text: str, args, plot) -> Path:
    """:func:`write_result` under ``args.out`` as ``args.name``, then ``plot(result, path)`` to ``NAME.png``."""
    out = write_result(result, text, args.out, args.name)
    return plot(result, out / f"{args.name}.png")
