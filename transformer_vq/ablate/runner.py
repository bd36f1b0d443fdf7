"""Run an experiment matrix: every cell and seed in its own process and run directory, resumable, with progress.

Layout of the work directory (default ``runs/ablate-<matrix>``):

* ``settings.json``: the matrix and settings it was started with (a rerun with other settings is refused, so a
  resumed matrix never mixes two experiments);
* ``runs/<cell>-seed<k>/``: the run directory of one training (checkpoints, ``metrics.jsonl``, ``train.log``, and
  ``recall.json`` when the matrix has the recall probe);
* ``cells/<cell>-seed<k>.json``: the record of a finished training. A rerun skips the trainings that have one and
  resumes the others from their last checkpoint.

Matrices share cells (the codebook matrix's ``S512`` is the attention matrix's ``vq``): a training whose run config
equals, up to its name, directory and thread count, one finished in a sibling work directory (another
``runs/ablate-*`` by default) is not repeated; its record is copied, with ``reused_from`` naming the source (when the
matrix has a probe, only a record that holds the probe's score is).

The report (JSON, markdown, plots) is written by :mod:`transformer_vq.ablate.report` when every cell is done.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.ablate.cells import (cell_config, cell_id, cell_record, child_command, preset_note, read_metrics,
                                         refuse_unread, score_recall)
from transformer_vq.config import ConfigError
from transformer_vq.config.ablate import MATRICES, AblateConfig, Matrix, default_of
from transformer_vq.config.fields import fields_of
from transformer_vq.config.flags import output_dir
from transformer_vq.train.checkpoint.rundir import wait_until_free
from transformer_vq.train.device import resolve_device
from transformer_vq.train.lm.build import check_corpus_options, load_corpus_for
from transformer_vq.train.signals import PARENT_ENV

POLL_S = 2.0
"""How often the progress line reads the running cell's metrics."""

LEFTOVER_WAIT_S = 300.0
"""How long a cell waits for a training of it left running by a killed matrix (saving on its way out)."""


def run_ablation(cfg: AblateConfig, *, matrix: Matrix | None = None, isolate: bool = True, log=print) -> dict:
    """Run the matrix of ``cfg`` (or ``matrix``, a custom one) and write its report; returns the report's result.

    Every configuration is checked before any cell trains, so a matrix that cannot run fails at once. A cell whose
    process fails is reported (``status`` "error" with its last log line) and the matrix goes on. ``isolate`` false
    trains the cells in this process (faster to start, for tests; a crash then stops the matrix).
    """
    from transformer_vq.ablate.report import write_ablation_report

    whole = matrix or MATRICES[cfg.matrix]
    matrix = cfg.chosen(whole)
    work = Path(cfg.resolved_work_dir())
    jobs = [(cell, seed) for cell in matrix.cells for seed in cfg.seeds]
    configs = {job: cell_config(cfg, matrix, *job, work) for job in jobs}
    refuse_unread(cfg, list(configs.values()))
    note = preset_note(cfg, matrix, configs, work)
    if note:
        log(note)
    for run_cfg in configs.values():  # the dataset's own checks of --data-option, before any cell or report
        check_corpus_options(run_cfg.train)
    # the corpus itself, once (every cell reads the same): one that cannot load (no --data-path, an empty file) is
    # one line here, not a failure in every cell; and a first build is made here once, not raced by the cells
    load_corpus_for(next(iter(configs.values())).train)
    resolve_device(cfg.device)  # and the device and the report's directory: no cell trains for a run that would fail
    output_dir(cfg.out)
    _hold_settings(work, cfg, whole)  # the whole matrix's: a run with other --cells continues the same one
    parallel = cfg.jobs > 1 and isolate
    progress = _Progress(len(jobs), cfg.steps, log, parallel=parallel)
    stop = threading.Event()

    def run_job(index: int, cell: str, seed: int) -> dict:
        done = work / "cells" / f"{cell_id(cell, seed)}.json"
        if done.is_file():
            log(f"[{index}/{len(jobs)}] {cell_id(cell, seed)}: finished earlier, skipped")
            return json.loads(done.read_text())
        # looked for when the training is due, not before: a sibling matrix running beside may just have finished it
        record = _finished_elsewhere(work, configs[(cell, seed)], matrix.probe)
        if record is not None:
            log(f"[{index}/{len(jobs)}] {cell_id(cell, seed)}: identical to {record['reused_from']}, reused")
            record = {**record, "cell": cell, "seed": seed}
        else:
            # a training of this cell left by a killed matrix is stopping (SIGTERM came with its parent's death)
            # and saves first: wait for it, then resume from its checkpoint
            wait_until_free(Path(configs[(cell, seed)].train.run_dir), LEFTOVER_WAIT_S,
                            on_wait=lambda message: log(f"[{index}/{len(jobs)}] {cell_id(cell, seed)}: {message}"))
            update = progress.cell(index, cell_id(cell, seed))
            record = (_train_cell(configs[(cell, seed)], cell, seed, update, matrix.probe, stop) if isolate
                      else _train_cell_here(configs[(cell, seed)], cell, seed, update, matrix.probe))
        if record["status"] == "done":
            fileio.atomic_write_text(done, json.dumps(record))
        return record

    numbered = [(index, *job) for index, job in enumerate(jobs, 1)]
    if parallel:
        records = _run_parallel(run_job, numbered, cfg.jobs, stop)
    else:
        records = [run_job(*job) for job in numbered]
    return write_ablation_report(cfg, matrix, records)


def _run_parallel(run_job, numbered: list[tuple], n_jobs: int, stop: threading.Event) -> list[dict]:
    """``run_job`` of every numbered job, ``n_jobs`` at a time (threads that each wait on one child process); the
    records in the jobs' order. Interrupted, every running child is stopped (it saves its checkpoint) before this
    returns, and jobs not yet started never start."""
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        futures = [pool.submit(run_job, *job) for job in numbered]
        try:
            return [future.result() for future in futures]
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise


def _hold_settings(work: Path, cfg: AblateConfig, matrix: Matrix) -> None:
    """Record the settings in a new work directory; refuse to continue one started with other settings."""
    settings = {"matrix": dataclasses.asdict(matrix), "settings": {k: v for k, v in cfg.to_dict().items()
                                                                    if k not in ("out", "name", "threads", "jobs",
                                                                                 "cells")}}
    settings = json.loads(json.dumps(settings))  # tuples as the file holds them: lists
    path = work / "settings.json"
    if path.is_file():
        saved = _with_added_fields(json.loads(path.read_text()), settings)
        if saved != settings:
            changed = sorted(k for k in settings["settings"] if saved["settings"].get(k) != settings["settings"][k])
            raise ConfigError(f"{work} holds a matrix started with other settings ({', '.join(changed) or 'cells'} "
                              f"differ); give another --work-dir, or remove {work} to start over")
        return
    (work / "cells").mkdir(parents=True, exist_ok=True)
    fileio.atomic_write_text(path, json.dumps(settings, indent=2))


def _with_added_fields(saved: dict, settings: dict) -> dict:
    """``saved`` with the fields that AblateConfig and Matrix gained after it was written, at their defaults: a work
    directory of an older version continues as long as they keep them."""
    for key, cls in (("matrix", Matrix), ("settings", AblateConfig)):
        for name, field in fields_of(cls).items():
            if name in settings[key] and name not in saved[key]:
                saved[key][name] = json.loads(json.dumps(default_of(field)))
    return saved


def _training_key(request: dict) -> str:
    """What makes two trainings the same: the run config without the cell's name, directory and thread count."""
    train = {k: v for k, v in request["train"].items() if k not in ("name", "run_dir", "threads")}
    return json.dumps({**request, "train": train}, sort_keys=True)


def _write_request(run_cfg) -> Path:
    """The cell's run config as ``request.json`` in its run directory: what the child trains, and what a later
    matrix compares its own cells with."""
    run_dir = Path(run_cfg.train.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    request = run_dir / "request.json"
    fileio.atomic_write_text(request, run_cfg.to_json())
    return request


def _finished_elsewhere(work: Path, run_cfg, probe: str | None) -> dict | None:
    """The record of a finished training, in a sibling work directory, identical to ``run_cfg`` and scored on
    ``probe`` if one is named (None if none)."""
    key = _training_key(json.loads(run_cfg.to_json()))
    for request in sorted(work.resolve().parent.glob("*/runs/*/request.json")):
        other = request.parent.parent.parent
        record = other / "cells" / f"{request.parent.name}.json"
        if other == work.resolve() or not record.is_file():
            continue
        record = json.loads(record.read_text())
        if probe is not None and probe not in record:
            continue
        if _training_key(json.loads(request.read_text())) == key:
            return {**record, "reused_from": str(request.parent)}
    return None


def _train_cell_here(run_cfg, cell: str, seed: int, progress, probe: str | None) -> dict:
    """Train one cell in this process, and score it on ``probe``; its record."""
    from transformer_vq.train import train

    _write_request(run_cfg)
    begin = time.perf_counter()
    progress(_last_step(Path(run_cfg.train.run_dir)))
    result = train(run_cfg, resume="auto")
    progress(result.step, finished=True)
    if result.exit_code:
        raise KeyboardInterrupt  # stopped by a signal: the checkpoint is saved, the matrix resumes from it
    if probe == "recall":
        score_recall(run_cfg)
    return cell_record(cell, seed, Path(run_cfg.train.run_dir), time.perf_counter() - begin)


def _train_cell(run_cfg, cell: str, seed: int, progress, probe: str | None, stop: threading.Event) -> dict:
    """Train one cell in a child process (which then scores it on ``probe``), following its metrics for the progress
    line, until it ends or ``stop`` is set; its record."""
    request = _write_request(run_cfg)
    run_dir = request.parent
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
           PARENT_ENV: str(os.getpid())}
    begin = time.perf_counter()
    with open(run_dir / "train.log", "a") as out:
        child = subprocess.Popen(child_command(request, probe), stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while child.poll() is None:
                if stop.wait(POLL_S):
                    raise KeyboardInterrupt  # another job was interrupted: the whole matrix stops
                progress(_last_step(run_dir))
        except BaseException:
            child.terminate()  # the child saves a checkpoint on SIGTERM: the matrix resumes from it
            child.wait()
            raise
    wall = time.perf_counter() - begin
    progress(_last_step(run_dir), finished=True)
    if child.returncode != 0:
        lines = (run_dir / "train.log").read_text(errors="replace").strip().splitlines() or ["no output"]
        return {"cell": cell, "seed": seed, "status": "error", "error": lines[-1][:300], "wall_s": round(wall, 2)}
    return cell_record(cell, seed, run_dir, wall)


def _last_step(run_dir: Path) -> int:
    rows, _ = read_metrics(run_dir)
    return rows[-1]["step"] if rows else 0


class _Progress:
    """``[cell i/n] name  step s/S  eta ...``: one line per update on a terminal (rewritten in place when one cell
    runs at a time), one every tenth of a cell otherwise. The estimate is this invocation's wall seconds per trained
    step (over every cell, running ones included) times the steps left."""

    def __init__(self, n_jobs: int, steps: int, log, parallel: bool = False):
        self.n_jobs, self.steps, self.log = n_jobs, steps, log
        self.start = time.perf_counter()
        self.trained = {}  # cell index -> steps this invocation trained in it
        self.current = {}  # index of each cell started -> its last step
        self.lock = threading.Lock()
        self.tty = sys.stdout.isatty() and log is print and not parallel

    def cell(self, index: int, name: str):
        first = {"step": None, "shown": -1}

        def update(step: int, finished: bool = False) -> None:
            with self.lock:
                if first["step"] is None:
                    first["step"] = step  # a resumed cell starts at its checkpoint
                self.trained[index], self.current[index] = step - first["step"], step
                done = sum(self.trained.values())
                rate = (time.perf_counter() - self.start) / done if done > 0 else None
                left = (self.n_jobs - max(self.current)) * self.steps + sum(self.steps - s for s in
                                                                           self.current.values())
            eta = "?" if rate is None else _duration(rate * left)
            line = f"[cell {index}/{self.n_jobs}] {name}  step {step}/{self.steps}  eta {eta}"
            if finished:
                print("\r" + line + "  done", flush=True) if self.tty else self.log(line + "  done")
            elif self.tty:
                print("\r" + line, end="", flush=True)
            elif step * 10 // self.steps > first["shown"]:
                first["shown"] = step * 10 // self.steps
                self.log(line)

        return update


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"
