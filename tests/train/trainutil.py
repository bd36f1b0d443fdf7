"""Helpers of the training tests: a small local corpus, a CPU-sized run config, running `tvq`.

Every test trains the ``tiny`` preset (d_model 32, one layer, block_len 8) on ~40 kB of text, so a
step takes milliseconds and the whole directory runs in a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from transformer_vq.train import load_config

REPO = Path(__file__).resolve().parents[2]

# Window settings of every test run: 2 windows per sequence, so checkpoints can fall mid-batch.
TINY = ["seq_len=32", "update_len=16", "batch_size=4", "warmup_steps=5", "log_every=1000", "eval_tokens=512",
        "eval_streams=2", "sample_tokens=0", "lr=3e-3"]


def write_corpus(path: Path, n_lines: int = 1200) -> Path:
    """A deterministic text file of ~40 kB with some structure to learn."""
    words = ["the", "king", "shall", "speak", "to", "thee", "of", "love", "and", "war", "my", "lord", "good", "night"]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 5)) + "." for i in range(n_lines)]
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_overrides(corpus_file: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["data=text", f"data_path={corpus_file}", f"run_dir={run_dir}", *TINY, *extra]


def tiny_config(corpus_file: Path, run_dir: Path, *extra: str):
    return load_config("tiny", overrides=tiny_overrides(corpus_file, run_dir, *extra))


def cli_args(corpus_file: Path, run_dir: Path, *extra: str) -> list[str]:
    """`tvq train` arguments for the tiny test run."""
    args = ["train", "--preset", "tiny"]
    for item in tiny_overrides(corpus_file, run_dir, *extra):
        args += ["--set", item]
    return args


def tvq_process(args: list[str], *, one_thread: bool = True) -> subprocess.Popen:
    """Start `python -m transformer_vq ARGS` (stdout/stderr captured, text mode). ``one_thread``: the
    same thread count as the in-process runs (conftest._one_thread), for bitwise comparisons."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "transformer_vq", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def torchrun(args: list[str], nproc: int = 2, timeout: float = 300,
             entry: tuple[str, ...] = ("-m", "transformer_vq"), check: bool = True) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node NPROC -m transformer_vq ARGS` on CPU (gloo), one thread per worker (``entry``:
    what each worker runs instead of ``-m transformer_vq``, e.g. a script's path); ``check``: fail unless it exits 0.

    A run still going after ``timeout`` seconds fails the test with every process's Python stack: the launcher and its
    workers run with ``faulthandler`` on (``PYTHONFAULTHANDLER``), and each is sent SIGABRT (a hang once seen in CI,
    one worker waiting in gloo after the other had exited, left nothing to go on)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               *entry, *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=REPO) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # the workers first: torchrun starts them in sessions of their own
            family = [*descendants(proc.pid), proc.pid]
            signal_all(family, signal.SIGABRT)  # each prints its threads' stacks, then dies
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                signal_all(family, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            raise AssertionError(f"torchrun {' '.join(args)} still running after {timeout:g} s; the stacks of its "
                                 f"processes:\n{stderr[-12000:]}") from None
    assert proc.returncode == 0 or not check, stderr[-3000:]
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, grandchildren, ...), from /proc (empty where there is none)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # the process ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def read_metrics(run_dir: Path) -> list[dict]:
    """The training-step records of metrics.jsonl (evaluation records left out)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "eval" not in r]


def rewind(run_dir: Path, step: int) -> None:
    """Make checkpoint ``step`` the run's newest (later ones deleted) and empty its metrics, as if the
    run had stopped there."""
    checkpoints = run_dir / "checkpoints"
    for later in checkpoints.glob("step_*"):
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    (checkpoints / "latest").write_text(f"step_{step:08d}\n")
    (run_dir / "metrics.jsonl").write_text("")


def final_weights(run_dir: Path) -> dict:
    """The weights and buffers of a run's newest checkpoint in one plain model (FSDP shards joined)."""
    from transformer_vq.train.lm.build import model_from_checkpoint

    model, _, _ = model_from_checkpoint(str(run_dir), device="cpu")
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def kill_after_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int) -> int:
    """SIGKILL a training process once its run holds a complete checkpoint at ``step`` or later;
    returns the step of the checkpoint a resume would start from."""
    from transformer_vq.train.checkpoint import latest_checkpoint

    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        ckpt = latest_checkpoint(run_dir / "checkpoints", log=lambda msg: None) \
            if (run_dir / "checkpoints").is_dir() else None
        if ckpt is not None and ckpt.step >= step:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.communicate()[1]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return latest_checkpoint(run_dir / "checkpoints").step
