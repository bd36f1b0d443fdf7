"""Crashes lose nothing: every kind of training, SIGKILLed at random moments again and again and resumed each time,
ends exactly where an uninterrupted run ends — the same weights bit for bit, every step and every validation logged
once with the same numbers, the end of the run (its report, a language model's sample) printed by the last resume.

Kinds: `tvq train` (Transformer-VQ, and LongVQ's language model), `tvq classify train`, FSDP under torchrun (the
whole process group killed, as a lost machine is), and `tvq ablate`, whose parent alone is killed: its training
children must stop with it (saving first), and the rerun continues them. At least 10 kills per kind, at moments drawn
from a seeded generator (the whole process's life, start-up and the end of the run included).

Slow (minutes): ``pytest -m slow tests/train/test_kill_loop.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainutil import REPO, cli_args, final_weights, write_corpus

pytestmark = pytest.mark.slow

KILLS = 10
STEPS = ("steps=30", "ckpt_every=4", "eval_every=6", "keep_ckpts=2")


def start(argv: list[str], *, torchrun: bool = False) -> subprocess.Popen:
    """`python -m transformer_vq ARGV` (or under torchrun, 2 workers) in a session of its own, one thread per
    process so that runs compare bit for bit."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] \
        if torchrun else [sys.executable]
    return subprocess.Popen([*launcher, "-m", "transformer_vq", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return out


def kill_loop(argv: list[str], duration: float, rng: random.Random, *, torchrun: bool = False,
              parent_only: bool = False, after_kill=None) -> str:
    """Start ``argv``, SIGKILL it at a random moment of its expected life, again, until it was killed :data:`KILLS`
    times; then let one start run to its end and return its stdout. The expected life starts as ``duration`` (an
    uninterrupted run's) and becomes that of a start which ended before its moment (the run is complete: the next
    starts resume a finished run, and are killed in that shorter life). ``parent_only``: kill the first process
    only (its children are left to die with it), then call ``after_kill()``; otherwise every process of the tree
    (torchrun's workers are session leaders of their own: a killed process group would leave them)."""
    kills, life = 0, duration
    while kills < KILLS:
        proc = start(argv, torchrun=torchrun)
        begin = time.perf_counter()
        try:
            proc.wait(timeout=rng.uniform(0.2, life))
            assert proc.returncode == 0, proc.stderr.read()[-3000:]
            life = max(time.perf_counter() - begin, 0.3)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid] if parent_only else [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            out, err = proc.communicate()
            print(f"---- start killed after {time.perf_counter() - begin:.2f} s\n{out}{err[-2000:]}")
            if after_kill is not None:
                after_kill()
        proc.stdout.close(), proc.stderr.close()
    return finish(start(argv, torchrun=torchrun))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children before grandchildren."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(0), [])
        found += children
        queue += children
    return found


def timed(argv: list[str], **options) -> tuple[str, float]:
    begin = time.perf_counter()
    out = finish(start(argv, **options))
    return out, time.perf_counter() - begin


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl without what differs between two identical runs (time, throughput)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("seconds", "tokens_per_s")} for row in rows]


def assert_same_run(run_dir: Path, reference: Path, weights) -> None:
    """Same weights, same metrics line for line (validations included, bit for bit)."""
    got, expected = metrics(run_dir), metrics(reference)
    steps = [row["step"] for row in got if "eval" not in row]
    assert steps == sorted(set(steps)), "a step is logged twice"
    assert got == expected
    a, b = weights(run_dir), weights(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def the_end(out: str) -> str:
    """What the end of a run printed, less what differs between two identical runs (the throughput, the run
    directory): the sample, if any, and the final validation."""
    end = out[out.index("done:"):].splitlines()[0]
    sample = out[out.index("sample ("):out.index("done:")] if "sample (" in out else ""
    return sample + re.sub(r" at [0-9,.]+ training tokens/s", "", end)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


LM_KINDS = {
    "tvq": (),
    "longvq": ("--arch", "longvq"),
}


@pytest.mark.parametrize("kind", LM_KINDS)
def test_language_model(kind, corpus, tmp_path):
    def argv(run_dir):
        return [*cli_args(corpus, run_dir, *STEPS, "sample_tokens=24"), *LM_KINDS[kind], "--resume", "auto"]

    out, duration = timed(argv(tmp_path / "reference"))
    got = kill_loop(argv(tmp_path / "killed"), duration, random.Random(kind))
    assert_same_run(tmp_path / "killed", tmp_path / "reference", final_weights)
    assert the_end(got) == the_end(out)


def test_classifier(tmp_path):
    from transformer_vq.train.classify import classifier_from_checkpoint

    def argv(run_dir):
        return ["classify", "train", "--preset", "tiny", "--data", "digits", "--run-dir", str(run_dir), "--steps",
                "30", "--ckpt-every", "4", "--eval-every", "6", "--keep-ckpts", "2", "--batch-size", "8", "--device",
                "cpu", "--log-every", "1000", "--resume", "auto"]

    def weights(run_dir):
        model, _, _ = classifier_from_checkpoint(str(run_dir), device="cpu")
        return model.state_dict()

    out, duration = timed(argv(tmp_path / "reference"))
    got = kill_loop(argv(tmp_path / "killed"), duration, random.Random("classify"))
    assert_same_run(tmp_path / "killed", tmp_path / "reference", weights)
    assert the_end(got) == the_end(out)
    assert weights(tmp_path / "killed" / "best").keys()  # the best checkpoint is whole


def test_fsdp(corpus, tmp_path):
    def argv(run_dir):
        return [*cli_args(corpus, run_dir, *STEPS, "parallel=fsdp"), "--resume", "auto"]

    out, duration = timed(argv(tmp_path / "reference"), torchrun=True)
    got = kill_loop(argv(tmp_path / "killed"), duration, random.Random("fsdp"), torchrun=True)
    assert_same_run(tmp_path / "killed", tmp_path / "reference", final_weights)
    assert the_end(got) == the_end(out)


def test_ablate_children_die_with_the_parent_and_the_rerun_continues_them(tmp_path):
    def argv(work):
        return ["ablate", "--matrix", "bias-span", "--preset", "tiny", "--data", "shakespeare", "--steps", "30",
                "--seeds", "0", "--seq-len", "32", "--update-len", "16", "--batch-size", "2", "--eval-every", "6",
                "--eval-tokens", "128", "--ckpt-every", "4", "--threads", "1", "--work-dir", str(work), "--out",
                str(work / "out"), "--set", "block_len=8"]

    def no_training_left():
        """Every child of the killed parent stops within seconds (each saves first): no run directory stays
        locked by a live process."""
        deadline = time.time() + 30
        while time.time() < deadline:
            if not [lock for lock in (tmp_path / "b" / "killed").glob("runs/*/.lock") if _held(lock)]:
                return
            time.sleep(0.2)
        pytest.fail("a training child outlived its killed `tvq ablate` parent")

    # apart: a matrix reuses the finished cells of its sibling work directories
    reference, killed = tmp_path / "a" / "reference", tmp_path / "b" / "killed"
    _, duration = timed(argv(reference))
    kill_loop(argv(killed), duration, random.Random("ablate"), parent_only=True, after_kill=no_training_left)
    for run in sorted((reference / "runs").iterdir()):
        assert_same_run(killed / "runs" / run.name, run, final_weights)
    records = [json.loads(p.read_text()) for p in sorted((killed / "cells").glob("*.json"))]
    assert [r["status"] for r in records] == ["done", "done"] and not any("reused_from" in r for r in records)


def _held(lock: Path) -> bool:
    """Whether a live process holds the run-directory lock file ``lock``."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
