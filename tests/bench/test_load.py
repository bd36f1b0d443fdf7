"""The others' load a benchmark prints: runnable threads of processes outside the benchmark's own tree."""

from __future__ import annotations

import os

from transformer_vq.bench import load
from transformer_vq.bench.load import OthersLoad, load_summary, load_text


def fake_process(root, pid, ppid, states):
    """A ``/proc/<pid>`` with a ``stat`` (command name with a space and a parenthesis) and one task per state."""
    (root / str(pid) / "task").mkdir(parents=True)
    (root / str(pid) / "stat").write_text(f"{pid} (a (b) c) S {ppid} 1 1\n")
    for i, state in enumerate(states):
        (root / str(pid) / "task" / str(pid + i)).mkdir()
        (root / str(pid) / "task" / str(pid + i) / "stat").write_text(f"{pid + i} (a (b) c) {state} {ppid} 1 1\n")


def test_only_threads_outside_this_process_tree_count(tmp_path, monkeypatch):
    me = os.getpid()
    fake_process(tmp_path, me, 1, "RR")  # this process
    fake_process(tmp_path, 900001, me, "R")  # a spawned worker
    fake_process(tmp_path, 900011, 900001, "RR")  # its child
    fake_process(tmp_path, 900021, 1, "RSR")  # another job: two runnable threads
    fake_process(tmp_path, 900031, 1, "SS")  # an idle one
    (tmp_path / "self").mkdir()  # not a process id
    monkeypatch.setattr(load, "PROC", tmp_path)
    assert load.others_runnable() == 2
    with OthersLoad(interval=0.01) as watched:
        pass
    assert watched.samples and set(watched.samples) == {2}
    assert load_text(watched.summary()).startswith("others' load: 2.0 runnable threads on average, at most 2 (")


def test_without_proc_the_load_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "PROC", tmp_path / "missing")
    assert load.others_runnable() is None
    assert load_summary([]) == {"others_runnable_mean": None, "others_runnable_max": None, "samples": 0}
    assert load_text(load_summary([])) == "others' load: unknown (no /proc)"
