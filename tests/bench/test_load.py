"""The others' load a benchmark prints: runnable threads of processes outside the benchmark's own tree."""

from __future__ import annotations

import os

from transformer_vq.bench import load
from transformer_vq.bench.load import OthersLoad, load_summary, load_text


def fake_process(root, pid, states, children=()):
    """A ``/proc/<pid>`` with one task per state (a ``stat`` whose command name holds a space and a parenthesis);
    its first task lists ``children``."""
    for i, state in enumerate(states):
        task = root / str(pid) / "task" / str(pid + i)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{pid + i} (a (b) c) {state} 1 1 1\n")
        (task / "children").write_text(" ".join(map(str, children if i == 0 else ())) + ("\n" if i == 0 else ""))


def test_only_threads_outside_this_process_tree_count(tmp_path, monkeypatch):
    me = os.getpid()
    fake_process(tmp_path, me, "RR", children=[900001])  # this process
    fake_process(tmp_path, 900001, "R", children=[900011])  # a spawned worker
    fake_process(tmp_path, 900011, "RR")  # its child
    fake_process(tmp_path, 900021, "RSR")  # another job, not read: the machine's count holds its two threads
    # the machine: our 5 runnable threads, the other job's 2 and one kernel thread's
    (tmp_path / "stat").write_text("cpu  1 2 3\nprocs_running 8\nprocs_blocked 0\n")
    monkeypatch.setattr(load, "PROC", tmp_path)
    assert load.others_runnable() == 3
    with OthersLoad(interval=0.01) as watched:
        pass
    assert watched.samples and set(watched.samples) == {3}
    assert load_text(watched.summary()).startswith("others' load: 3.0 runnable threads on average, at most 3 (")


def test_a_worker_that_ends_while_read_is_not_an_error(tmp_path, monkeypatch):
    me = os.getpid()
    fake_process(tmp_path, me, "R", children=[900001])  # the worker is listed but its /proc entry is gone
    (tmp_path / "stat").write_text("procs_running 1\n")
    monkeypatch.setattr(load, "PROC", tmp_path)
    assert load.others_runnable() == 0


def test_a_sample_reads_no_other_process(tmp_path, monkeypatch):
    """The sampler runs beside the timed calls: it must not scan the machine's processes (about 10 ms under the
    GIL, which slowed the calls it watched, the audit's finding)."""
    me = os.getpid()
    fake_process(tmp_path, me, "R")
    for pid in range(900000, 900050):
        fake_process(tmp_path, pid, "R")
    (tmp_path / "stat").write_text("procs_running 51\n")
    monkeypatch.setattr(load, "PROC", tmp_path)
    read, stat_fields = [], load._stat_fields
    monkeypatch.setattr(load, "_stat_fields", lambda path: read.append(path) or stat_fields(path))
    assert load.others_runnable() == 50
    assert {int(path.parts[-4]) for path in read} == {me}


def test_without_proc_the_load_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "PROC", tmp_path / "missing")
    assert load.others_runnable() is None
    assert load_summary([]) == {"others_runnable_mean": None, "others_runnable_max": None, "samples": 0}
    assert load_text(load_summary([])) == "others' load: unknown (no /proc)"
