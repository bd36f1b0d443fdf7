"""Helpers of the command-line tests: run `tvq` in process (fast, most cases) or as a real process (exit status
of the entry point, signals, locks), and check that a bad input is answered with one line and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from transformer_vq.cli import main

REPO = Path(__file__).resolve().parents[2]


def tiny_train(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    """`tvq train` arguments of a run that takes about a second: the tiny preset, two windows per batch."""
    return ["train", "--preset", "tiny", "--data", "text", "--data-path", str(corpus), "--run-dir", str(run_dir),
            "--seq-len", "32", "--update-len", "16", "--batch-size", "4", "--steps", "2", "--sample-tokens", "0",
            "--eval-tokens", "256", "--eval-streams", "2", "--log-every", "1000", *extra]


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    """Run `tvq ARGV` in this process; return its exit status and stderr, after checking that no traceback
    reached stderr (argparse's own exits are SystemExit)."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def error_line(capsys, argv: list[str]) -> str:
    """The one `error: ...` line of a refused command (exit status 2), without its newline."""
    code, err = run_cli(capsys, argv)
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def tvq(argv: list[str], *, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m transformer_vq ARGV` as a real process (this tree first on the path)."""
    return subprocess.run([sys.executable, "-m", "transformer_vq", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=process_env())


def process_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}
