"""Where a training starts: a fresh run refuses a run directory that already holds checkpoints, a resumed one
finds the checkpoint it continues from, and a resume that would train nothing is refused before anything loads.
Shared by every task's trainer and command."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from transformer_vq.config import ConfigError
from transformer_vq.config.fields import flag_of
from transformer_vq.train.checkpoint.store import (BEST_DIR, CHECKPOINTS_DIR, STEP_DIR, TRAINING_REMEDY, Checkpoint,
                                                  find_checkpoint, is_checkpoint_dir, latest_checkpoint,
                                                  list_checkpoints, missing, resume_order, run_dir_holding,
                                                  weights_only)


def refuse_fresh_over_checkpoints(ckpt_root: Path, run_dir: Path, resume: str | None) -> None:
    """A new run (``resume`` None), or one resumed from another run's checkpoint (``--resume PATH`` with a
    ``--run-dir`` of its own), must not write over another run's checkpoints: raise :class:`ConfigError`. Every
    trainer calls it as soon as it holds the run directory's lock, before its data are read (a corpus can take hours
    to build), and again when it starts."""
    if not list_checkpoints(ckpt_root):
        return
    if resume is None:
        raise ConfigError(
            f"run directory {run_dir} already holds checkpoints; continue that run with --resume auto, "
            f"or start a new one with another --run-dir (or --name)"
        )
    if resume != "auto" and run_dir_named(resume).resolve() != Path(run_dir).resolve():
        raise ConfigError(
            f"--resume {resume}: run directory {run_dir} already holds checkpoints of another run, and the two runs' "
            f"checkpoints and metrics would mix; leave out --run-dir/--name to continue in "
            f"{run_dir_named(resume)}, or give a new --run-dir"
        )


def refuse_over_checkpoints_of(run_dir: Path, resume: str | None) -> None:
    """:func:`refuse_fresh_over_checkpoints` for the run directory ``run_dir`` (its checkpoints/ folder)."""
    refuse_fresh_over_checkpoints(Path(run_dir) / CHECKPOINTS_DIR, Path(run_dir), resume)


def run_dir_named(resume: str | Path) -> Path:
    """The run directory ``--resume PATH`` names: PATH itself, ``RUN_DIR`` for ``RUN_DIR/checkpoints``, and for a
    checkpoint the run holding it (:func:`run_dir_holding`). A resumed run writes into it unless ``--run-dir`` says
    otherwise."""
    path = Path(resume)
    if is_checkpoint_dir(path):
        return run_dir_holding(path)
    return path.parent if path.name == CHECKPOINTS_DIR else path


def checkpoint_to_resume(ckpt_root: Path, resume: str, log) -> Checkpoint | None:
    """The checkpoint ``resume`` names: for ``"auto"`` the newest complete one under ``ckpt_root`` (None, logged,
    when there is none yet), else the run or checkpoint directory at that path."""
    if resume != "auto":
        return find_checkpoint(resume, remedy=TRAINING_REMEDY)
    ckpt = latest_checkpoint(ckpt_root, log=log)
    if ckpt is None:
        log(f"no checkpoint in {ckpt_root} yet: starting from scratch")
    return ckpt


def check_resume(run_dir: Path, resume: str | None, train) -> Path | None:
    """Refuse (:class:`ConfigError`) a resume that cannot go on, before any corpus, model or checkpoint is loaded:
    a run already past ``train.steps`` (a run at exactly ``steps`` is accepted: its end, final validation and
    sample, runs again, which finishes a run killed after its last save), or one asked to change a field it keeps
    (:func:`refuse_changed_fields`, read from the checkpoint's config.json).

    Read from the layout: ``resume`` is ``"auto"`` (run directory ``run_dir``), a run directory or one checkpoint
    directory. Returns the checkpoint the resume will start from (unverified), None for a new run."""
    if resume is None:
        return None
    path = Path(run_dir) if resume == "auto" else Path(resume)
    if resume != "auto" and not path.exists():  # auto starts a run whose directory is not there yet
        raise ConfigError(f"--resume: {missing(path)}")
    chosen = path if is_checkpoint_dir(path) else _newest(path)  # a checkpoint named is the one resumed from
    if chosen is None:
        return None
    if chosen.resolve().parent.name == BEST_DIR:
        raise ConfigError(f"--resume: {weights_only(chosen)}")
    named = STEP_DIR.match(chosen.name)  # a checkpoint renamed says its step in its state, which the resume reads
    if named:
        refuse_steps_below(path, int(named.group(1)), train.steps)
        refuse_second_history(Path(run_dir), int(named.group(1)), path)
    try:
        saved = json.loads((chosen / "config.json").read_text())
    except (OSError, ValueError):
        return chosen  # unreadable: the resume itself reports the checkpoint (and falls back to an earlier one)
    if isinstance(saved, dict) and isinstance(saved.get("train"), dict):
        refuse_changed_fields(saved["train"], train, chosen)
    return chosen


def _newest(path: Path) -> Path | None:
    """The checkpoint a resume of the run (or checkpoints) directory ``path`` starts from, unverified (the resume
    verifies it, and falls back to an earlier one if it is damaged); None if none."""
    found = resume_order(path / CHECKPOINTS_DIR) or resume_order(path)
    return found[0] if found else None


def refuse_second_history(run_dir: Path, step: int, resumed: Path) -> None:
    """Refuse (:class:`ConfigError`) to train from ``step`` into ``run_dir`` while it holds later checkpoints: a
    second history written over the first would be pruned, and resumed by ``--resume auto``, by step number, which
    mixes the two (a new checkpoint was pruned at once, and the next resume took the abandoned branch)."""
    later = [p.name for p in list_checkpoints(Path(run_dir) / CHECKPOINTS_DIR)
             if int(STEP_DIR.match(p.name).group(1)) > step]
    if later:
        raise ConfigError(f"--resume {resumed}: {run_dir} holds checkpoints after step {step} ({', '.join(later)}), "
                          f"and training from step {step} again there would mix two histories; continue in a new "
                          f"directory (--run-dir NEW), or move the later checkpoints out of "
                          f"{run_dir / CHECKPOINTS_DIR}")


def refuse_steps_below(path: Path, step: int, steps: int) -> None:
    """Refuse (:class:`ConfigError`) to continue the run in ``path``, at ``step``, to fewer ``steps``."""
    if steps < step:
        raise ConfigError(f"--steps: the run in {path} is already at step {step} and --steps is {steps}; "
                          f"give --steps {step} to finish it as it is, or above {step} to train further")


KEPT_ON_RESUME = {
    "batch_size": "the saved data position counts batches of this size: another would read other sequences from it",
    "optimizer": "the checkpoint holds that optimizer's state (its moments), which another optimizer cannot take",
    "update_len": "a step is one window of update_len tokens, and a checkpoint taken inside a batch continues at its "
                  "window with the state carried into it",
    "pack": "it decides which tokens each token attends to and is predicted from (its document's), and a checkpoint "
            "taken inside a batch carries its rows' positions in their documents",
}
"""Training fields a resumed run keeps, beside those that define its data, and why."""


def refuse_changed_fields(saved_train: dict, train, path) -> None:
    """Refuse (:class:`ConfigError`) to resume the run whose checkpoint at ``path`` saved training fields
    ``saved_train`` with ``train`` (a training config) when a field the run must keep differs: one that defines the
    run's data (marked ``defines_data``: the dataset, its options, the seed of its order, a language model's
    sequence length; the resumed run would read another dataset, or the same one in another order, from the saved
    position) or one of :data:`KEPT_ON_RESUME`. Checked before anything of the checkpoint is loaded or written."""
    for field in dataclasses.fields(train):
        reason = (f"{field.name} defines the run's data, which a resumed run keeps"
                  if field.metadata.get("defines_data") else KEPT_ON_RESUME.get(field.name))
        if reason is None or field.name not in saved_train:
            continue
        saved, now = saved_train[field.name], json.loads(json.dumps(getattr(train, field.name)))  # as saved
        if saved != now and not (field.name == "data_options"  # a default spelled out loads the same data
                                 and _with_defaults(train, saved) == _with_defaults(train, now)):
            flag = flag_of(field)
            keep = _flags_of(flag, saved)
            raise ConfigError(f"{flag}: the run in {path} was trained with {field.name} {saved!r} and this run asks "
                              f"for {now!r}; {reason}: leave it out (or give {keep}) to continue, or start a new run "
                              f"with another --run-dir")


def other_data(saved: dict, here: dict, *, noun: str, unit: str) -> tuple[str, str] | None:
    """``(saved, here)`` in words ("the text corpus of 9,000 training tokens read from FILE") when the two data
    identities a task saves in its checkpoints (a language model's corpus, a classifier's dataset: ``name``, each
    split's size in ``unit``, ``sample_sha256``, and ``data_path``, which only the words read) are different data;
    None when they are the same data, wherever it lies now. ``noun``: "corpus", "dataset"."""
    if all(saved.get(key) == here[key] for key in ("name", unit, "sample_sha256")):
        return None

    def described(identity: dict) -> str:
        path = identity.get("data_path")
        return (f"the {identity['name']} {noun} of {identity.get(unit, {}).get('train', 0):,} training {unit}"
                + (f" read from {path}" if path else ""))

    return described(saved), described(here)


# what each reader of a checkpoint's data says of other data: where it read it, and what to do
SAME_DATA_WORDS = {
    "resume": ("this run reads", "a resumed run continues on its own {noun} (moved elsewhere, it is recognized by its "
                                 "{unit}); resume with it, or start a new run (--run-dir)"),
    "eval": ("--data-path holds", "eval scores a run on its own {noun} (moved elsewhere, it is recognized by its "
                                  "{unit}); pass where that {noun} is now, or leave --data-path out"),
}


def check_same_data(saved: dict, here: dict, run_dir, *, noun: str, unit: str, reader: str = "resume") -> None:
    """Refuse (:class:`ConfigError`) to resume on other data than the checkpoint's (:func:`other_data`), which the
    fields a run keeps (:func:`refuse_changed_fields`) cannot tell: another ``--data-path``, or a file changed in
    place. Otherwise the saved data position, the validation split and every later figure would belong to other
    data. ``reader`` ("resume"; "eval": a classifier scored with another ``--data-path``) words it."""
    different = other_data(saved, here, noun=noun, unit=unit)
    if different is None:
        return
    reading, remedy = SAME_DATA_WORDS[reader]
    raise ConfigError(f"--data-path: the run in {run_dir} was trained on {different[0]} and {reading} "
                      f"{different[1]}, which differs: {remedy.format(noun=noun, unit=unit)}")


def _with_defaults(train, options: dict) -> dict:
    """``options`` of ``train``'s dataset with the loader's declared defaults filled in, as JSON would save them
    (as given where the dataset is unknown or refuses them: the resume reports that itself)."""
    from transformer_vq.config import ClassifyTrainConfig
    from transformer_vq.data import DataError
    from transformer_vq.data.options import identity

    try:
        if isinstance(train, ClassifyTrainConfig):
            from transformer_vq.data.classify.registry import classification_loader as find_loader
        else:
            from transformer_vq.data.registry import loader as find_loader
        return json.loads(json.dumps(identity(train.data, find_loader(train.data), None, options)["data_options"]))
    except DataError:
        return options


def _flags_of(flag: str, saved) -> str:
    """The flags that give ``saved`` again: ``--pack`` / ``--no-pack``, ``--data-option K=V ...`` (or leaving it out,
    for no options), else the value."""
    if isinstance(saved, bool):
        return flag if saved else f"--no-{flag[2:]}"
    if isinstance(saved, dict):  # each KEY=VALUE as parse_data_options reads it, quoted for a shell (lists, globs)
        return " ".join(f"{flag} {shlex.quote(f'{key}={_option_text(value)}')}" for key, value in saved.items()) \
            or f"no {flag}"
    return f"{saved!r}"


def _option_text(value) -> str:
    """A data option's value as ``--data-option`` reads it back: a string as it is, anything else as compact JSON
    (a YAML flow value: ``[0.8,0.1,0.1]``, ``true``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def resumed_base(resume: str, where: dict, train_cls, task: str):
    """The saved config a resume continues (None where there is none): for ``--resume auto``, that of the run
    directory ``where`` (the ``run_dir``/``name`` given, else the default) resolves to; for ``--resume PATH``, that
    of the run PATH names, continued in the directory ``where`` gives, else in PATH's own (never in the default
    run directory)."""
    from transformer_vq.config.fields import build
    from transformer_vq.config.load import resumed_config

    if resume == "auto":
        return resumed_config(build(train_cls, where, "train").resolved_run_dir(), task)
    named = Path(resume)  # a checkpoint named continues with its own config, not its run's latest attempt's
    base = resumed_config(named if is_checkpoint_dir(named) and (named / "config.json").is_file()
                          else run_dir_named(resume), task)
    if base is None:
        return None
    # it continues in the directory given (a fork: refused at the start if that one holds another run's checkpoints),
    # else in its own
    into = {"run_dir": where.get("run_dir"), "name": where.get("name", base.train.name)} if where else {
        "run_dir": str(run_dir_named(resume))}
    return dataclasses.replace(base, train=dataclasses.replace(base.train, **into))
