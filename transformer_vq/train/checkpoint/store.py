"""Checkpoints: written atomically, verified on load, never unpickling arbitrary objects.

Layout of a run directory's ``checkpoints/``::

    step_00000100/
        model.safetensors   weights and persistent buffers (the codebook EMA sums and counts)
        state.pt            optimizer, scheduler, step, data position, RNG states, carried operator
                            state: tensors and plain Python data only, loaded with weights_only=True
        config.json         the run's RunConfig, enough to rebuild the model from the checkpoint alone
        manifest.json       SHA-256 of the three files above, written last
    latest                  name of the newest complete checkpoint, updated after it is in place (for readers:
                            a resume takes the newest step_* that verifies, which a crash may leave newer)

A checkpoint is built in a temporary directory beside its final place, every file fsynced, then
renamed into place (:func:`transformer_vq.fileio.atomic_directory`), then ``latest`` is replaced the
same way; old checkpoints are pruned by renaming them out of the ``step_*`` names before deleting
them. A crash at any moment leaves either the previous set of checkpoints or the new one, never a
half-written or half-deleted checkpoint under a ``step_*`` name (the hidden debris it may leave is
removed at the next save); a checkpoint damaged later (truncated copy, bad disk) fails its checksum
and :func:`latest_checkpoint` falls back to the previous complete one. Weights or optimizer state
holding NaN or infinity are never saved. FSDP runs write their weights and optimizer state sharded
instead of ``model.safetensors`` (see dcp.py); everything else about a checkpoint is the same.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import safetensors.torch
import torch

from transformer_vq import fileio
from transformer_vq.config import LongVQConfig, TransformerVQConfig
from transformer_vq.config.reading import check_safetensors
from transformer_vq.train.checkpoint import dcp
from transformer_vq.train.checkpoint.errors import CheckpointError
from transformer_vq.train.finite import named_tensors, nonfinite_names

FILES = ("model.safetensors", "state.pt", "config.json")
STEP_DIR = re.compile(r"^step_(\d{8,})$")
CHECKPOINTS_DIR = "checkpoints"
"""The run directory's folder of the training checkpoints."""
BEST_DIR = "best"
"""A classification run's folder holding the checkpoint of its best validation (one, replaced on a new best)."""


@dataclass
class Checkpoint:
    """A verified checkpoint read from disk."""

    path: Path
    config: dict
    """The run config as saved (``RunConfig.to_dict()`` form)."""
    state: dict
    """Everything but the weights: step, optimizer, scheduler, data position, RNG states, ..."""
    sharded: bool = False
    """Written by FSDP training: weights and optimizer state in DCP shards (see dcp.py)."""

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def load_weights(self, model: torch.nn.Module) -> None:
        """Copy the saved weights and buffers into ``model`` (a plain, unsharded one) after checking it
        has the same architecture; the shards of an FSDP checkpoint are joined."""
        check_architecture(self.config["model"], model_config_of(model), self.path)
        if self.sharded:
            dcp.load_consolidated(self.path, model)
            return
        try:
            missing, unexpected = safetensors.torch.load_model(model, self._weights_file(), strict=False)
        except RuntimeError as err:
            raise CheckpointError(f"checkpoint {self.path} does not fit this model: {err}") from None
        if missing or unexpected:
            raise CheckpointError(
                f"checkpoint {self.path} does not fit this model: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}; it was saved by a different version of the model code"
            )

    def _weights_file(self) -> Path:
        return check_safetensors(self.path / "model.safetensors", "the weights of a checkpoint (safetensors)",
                                 "resume from another checkpoint of the run (checkpoints/step_*)")

    def load_training_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, sharded: bool) -> None:
        """Restore the weights, buffers and optimizer state of a training: ``sharded`` for a model
        sharded by FSDP (a collective, resliced for this number of workers), else a replicated one.

        A checkpoint of the other kind is converted, so a run moves between DDP (or one process) and FSDP as it
        moves between numbers of workers: the two store the optimizer state differently (whole and by parameter
        position; in shards and by parameter name), and :mod:`~transformer_vq.train.checkpoint.dcp` translates."""
        if "optimizer" not in self.state and "optimizer_groups" not in self.state:
            raise CheckpointError(weights_only(self.path))
        if self.sharded:  # resliced for this run's workers; a replicated run's processes each read every shard
            check_architecture(self.config["model"], model_config_of(model), self.path)
            dcp.load_shards(self.path, model, optimizer, self.state["optimizer_groups"], no_dist=not sharded)
        elif sharded:
            check_architecture(self.config["model"], model_config_of(model), self.path)
            try:
                weights = safetensors.torch.load_file(self._weights_file())
            except (RuntimeError, OSError) as err:
                raise CheckpointError(f"checkpoint {self.path} does not fit this model: {err}") from None
            dcp.load_replicated(self.path, model, optimizer, weights, self.state["optimizer"])
        else:
            self.load_weights(model)
            optimizer.load_state_dict(self.state["optimizer"])


def model_config_of(model: torch.nn.Module) -> TransformerVQConfig | LongVQConfig | None:
    """The config a model was built from (``TransformerVQ.cfg``, ``LongVQLM.cfg``), if it exposes one."""
    return getattr(model, "cfg", None)


def check_architecture(saved: dict, current: TransformerVQConfig | LongVQConfig | None, path: Path) -> None:
    """Raise a clear error when the checkpoint's model differs from ``current`` in a field that
    changes what the weights mean, or is another kind of model altogether (other config fields)."""
    if current is None:
        return
    now = current.to_dict()
    foreign = sorted(set(saved) - set(now))  # a checkpoint of an older version may lack newer fields, never more
    if foreign:
        raise CheckpointError(
            f"checkpoint {path} holds another kind of model than this run builds (its fields {', '.join(foreign)} "
            f"are not this model's). Use the architecture of the checkpoint (its config.json), or start a new run "
            f"with another --run-dir"
        )
    # A field the checkpoint's config lacks was added later: the checkpoint means its default (what from_dict reads).
    saved = {**{f.name: f.default for f in fields(current)}, **saved}
    ignored = frozenset(f.name for f in fields(current) if f.metadata.get("training_only"))
    diffs = [f"{k}={saved.get(k)!r} (checkpoint) vs {now[k]!r} (this run)"
             for k in sorted(now) if k not in ignored and saved.get(k) != now[k]]
    if diffs:
        raise CheckpointError(
            f"checkpoint {path} is from a different architecture: {'; '.join(diffs)}. Use the same model "
            f"settings as the checkpoint (its config.json), or start a new run with another --run-dir"
        )


def step_name(step: int) -> str:
    """The directory name of the checkpoint of optimizer step ``step``: ``step_00000800``."""
    return f"step_{step:08d}"


def save_checkpoint(root: Path, *, step: int, model: torch.nn.Module, config: dict, state: dict,
                    keep: int) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically, point ``latest`` at it, keep the newest ``keep``.

    ``state`` must hold only tensors and plain Python data (it is read back with weights_only=True).
    Weights or optimizer state that are not finite are refused (:class:`CheckpointError`): a
    checkpoint is only worth saving when training can resume from it. The debris of interrupted
    saves and prunings under ``root`` is removed first: call it only where no other process saves
    into ``root`` (a training holds its run directory's lock).
    """
    refuse_nonfinite(step, model, state)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fileio.clean_debris(root)
    final = root / step_name(step)
    with fileio.atomic_directory(final) as tmp:
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
        torch.save({**state, "step": step}, tmp / "state.pt")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        fileio.write_dir_manifest(tmp, FILES)
    _publish(root, final, keep)
    return final


def _publish(root: Path, final: Path, keep: int) -> None:
    """Point ``latest`` at the checkpoint just renamed into place and prune all but the newest ``keep``."""
    fileio.atomic_write_text(root / "latest", final.name + "\n")
    for old in list_checkpoints(root)[:-keep]:
        fileio.remove_tree(old)  # renamed out of the step_* names first: never half-deleted under its name


def save_sharded_checkpoint(root: Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            config: dict, state: dict, keep: int, dist_info, nonfinite_shards) -> Path | None:
    """Write checkpoint ``step`` of an FSDP run: every worker calls it with its own shards (a
    collective), rank 0 (which must hold the run directory's lock) writes the rest; atomic like
    :func:`save_checkpoint`. Returns the checkpoint's path on rank 0, None elsewhere.

    ``nonfinite_shards(named_tensors)`` names the tensors with NaN or infinity in any worker's shard, the same list on
    every worker (a collective): the trainer passes it, so that the storage format never imports the parallelism."""
    tensors, param_groups = dcp.sharded_state(model, optimizer)
    bad = nonfinite_shards(named_tensors(tensors, ""))
    if bad:  # every worker raises: the list is the same on all of them
        _refuse(step, [name.replace("model.", "", 1) for name in bad])
    root = Path(root)
    final = root / step_name(step)
    if dist_info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        fileio.clean_debris(root)
    with dcp.shared_directory(final, dist_info) as tmp:
        dcp.save_shards(tmp, tensors)  # returns on rank 0 once every worker's file and the index are written
        if dist_info.is_main:
            torch.save({**state, "optimizer_groups": param_groups, "step": step}, tmp / "state.pt")
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
            written = sorted(p.name for p in tmp.iterdir() if dcp.SHARD_FILE.match(p.name))
            fileio.write_dir_manifest(tmp, (*FILES[1:], dcp.METADATA, *written))
    if not dist_info.is_main:
        return None
    _publish(root, final, keep)
    return final


def refuse_nonfinite(step: int, model: torch.nn.Module, state: dict) -> None:
    """Raise :class:`CheckpointError` when the weights or the optimizer state hold NaN or infinity."""
    bad = nonfinite_names(named_tensors(dict(model.state_dict()), "")) + nonfinite_names(
        named_tensors(state.get("optimizer", {}), "optimizer"))
    if bad:
        _refuse(step, bad)


def _refuse(step: int, bad: list[str]) -> None:
    """Raise the :class:`CheckpointError` of a checkpoint whose tensors ``bad`` are not finite."""
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise CheckpointError(
        f"refusing to save checkpoint {step_name(step)}: {', '.join(bad[:3])}{more} hold NaN or infinity, "
        f"and training could not resume from it; lower the learning rate, or resume from an earlier checkpoint"
    )


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under ``root``, oldest first (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


_MANIFEST_PROBLEMS = {
    "no_manifest": "{path} is not a complete checkpoint (no manifest.json); it may have been interrupted while saving",
    "bad_manifest": "{path}/manifest.json is corrupted (not valid JSON)",
    "missing": "checkpoint {path} is missing {name}",
    "checksum": "checkpoint {path} is corrupted: {name} does not match its checksum (truncated or modified after "
                "saving)",
}


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one checkpoint directory. Raises :class:`CheckpointError` when it is
    incomplete, damaged, or holds anything but tensors and plain data."""
    path = Path(path)
    manifest = fileio.read_json(path / fileio.DIR_MANIFEST)
    sharded = manifest is not None and dcp.is_sharded(manifest)
    names = (*FILES[1:], *dcp.sharded_files(manifest)) if sharded else FILES
    problem = fileio.check_dir_manifest(path, names)
    if problem is not None:
        raise CheckpointError(_MANIFEST_PROBLEMS[problem.kind].format(path=path, name=problem.name))
    config = json.loads((path / "config.json").read_text())
    state = safe_torch_load(path / "state.pt")
    return Checkpoint(path=path, config=config, state=state, sharded=sharded)


def safe_torch_load(path: Path):
    """``torch.load`` restricted to tensors and plain data: a pickle that would construct any other
    object (and so could run code) is refused before anything in it runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"refusing to load {path}: it contains Python objects other than tensors and plain data, "
            f"which could run code when unpickled ({first_line}). Checkpoints written by transformer-vq "
            f"never do; only load files from sources you trust"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None


def resume_order(root: Path) -> list[Path]:
    """The checkpoint directories under ``root`` in the order a resume tries them: newest first. Not ``latest``'s
    first: every ``step_*`` directory was complete when renamed into place, and one newer than ``latest`` is a save
    stopped between its rename and ``latest``'s update (the rewinds that could also leave one are refused)."""
    return list_checkpoints(Path(root))[::-1]


def _lagging_pointer(root: Path, chosen: Path) -> str | None:
    """What ``latest`` names when that is not ``chosen`` (None when it is, or when it names no checkpoint)."""
    pointer = Path(root) / "latest"
    named = pointer.read_text(errors="replace").strip() if pointer.is_file() else ""
    return named if named and named != chosen.name and (Path(root) / named).is_dir() else None


# What to do when every checkpoint of a run is damaged, in the words of the command that met it
TRAINING_REMEDY = "start a new run with another --run-dir or without --resume"
READING_REMEDY = "pass --ckpt a run directory or a checkpoints/step_* directory whose checkpoint is intact"


def latest_checkpoint(root: Path, *, log=None, remedy: str = TRAINING_REMEDY) -> Checkpoint | None:
    """The newest complete checkpoint under ``root``: the newest that verifies (each damaged one skipped is
    reported through ``log``; so is a ``latest`` left behind by a save stopped before updating it).
    ``None`` when there is no checkpoint at all; when every one is damaged, a :class:`CheckpointError` ending in
    ``remedy``."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    candidates = resume_order(root)
    if not candidates:
        return None
    for path in candidates:
        try:
            found = read_checkpoint(path)
        except CheckpointError as err:
            log(f"warning: skipping checkpoint: {err}")
            continue
        lagging = _lagging_pointer(root, path)
        if lagging and path == candidates[0]:
            log(f"note: {root / 'latest'} names {lagging}, and {path.name} is newer and complete (a save stopped "
                f"before it updated latest): taking {path.name}")
        return found
    raise CheckpointError(f"no complete checkpoint in {root}: every one failed verification (see warnings "
                          f"above); {remedy}")


def missing(path: Path) -> str:
    """What is wrong with a checkpoint path that does not exist."""
    return (f"checkpoint path {path} does not exist; pass a run directory (e.g. runs/default) or one of its "
            f"checkpoints/step_* directories")


def find_checkpoint(path: str | Path, *, remedy: str = READING_REMEDY) -> Checkpoint:
    """Resolve what a user passes as ``--ckpt`` (or ``--resume PATH``, whose ``remedy`` is training's): a run
    directory, its ``checkpoints/`` directory, or one checkpoint directory."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(missing(path))
    if (path / "manifest.json").is_file() or STEP_DIR.match(path.name):
        return read_checkpoint(path)
    for root in (path / CHECKPOINTS_DIR, path):
        found = latest_checkpoint(root, remedy=remedy) if root.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError(f"no checkpoint found in {path}; pass a run directory written by `tvq train` "
                          f"(it has a checkpoints/ folder) or a checkpoints/step_* directory")


def run_dir_of(ckpt: Checkpoint) -> Path:
    """The run directory of a checkpoint (:func:`run_dir_holding`)."""
    return run_dir_holding(ckpt.path)


def weights_only(path: Path) -> str:
    """Why the checkpoint at ``path`` cannot be trained on from: it holds weights only."""
    return (f"checkpoint {path} holds the model's weights only (as a classification run's best/ checkpoints do), not "
            f"the optimizer state and data position a training continues from: resume from the run's checkpoints/ "
            f"(--resume {run_dir_holding(path)}), or read the weights with eval, sample or export")


def is_checkpoint_dir(path: Path) -> bool:
    """Whether ``path`` names one checkpoint: a directory holding a manifest (whatever its name: a copy, a link), or
    one named ``step_N`` (existing or not)."""
    return (Path(path) / "manifest.json").is_file() or bool(STEP_DIR.match(Path(path).name))


def run_dir_holding(checkpoint_dir: Path) -> Path:
    """The run directory of the checkpoint directory ``checkpoint_dir``, a link followed to the checkpoint it names:
    ``RUN_DIR`` for ``RUN_DIR/checkpoints/step_N`` or a classification run's ``RUN_DIR/best/step_N``, else the
    directory holding the checkpoint (moved out of its run). Never the checkpoint itself, which a run writing into
    it would corrupt."""
    path = Path(checkpoint_dir)
    parent = (path.resolve() if path.is_symlink() else path).parent
    return parent.parent if parent.name in (CHECKPOINTS_DIR, BEST_DIR) else parent
