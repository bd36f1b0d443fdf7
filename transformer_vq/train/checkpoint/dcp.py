"""Sharded checkpoints of FSDP runs (``torch.distributed.checkpoint``, DCP), with the guarantees of
the replicated ones: atomic, verified, resumable bit for bit, and safe to load.

Layout of one ``step_*`` directory (the files of store.py but the weights)::

    .metadata           DCP's index: which slice of which tensor lies in which file
    __R_0.distcp        the tensors worker R held: its shards of the weights and of the optimizer state
                        (rank 0 also writes the replicated tensors: the codebook buffers, Adam's step)
    state.pt            scheduler, step, data position, RNG states, carried state, the optimizer's
                        parameter groups (plain data, read with weights_only=True)
    config.json         the run config
    manifest.json       SHA-256 of every file above, written last

Every worker writes its own file into one temporary directory that rank 0 created (on multi-node
runs the run directory must be on a file system all nodes share); rank 0 then writes the rest and
renames the directory into place, as for a replicated checkpoint. DCP reslices on load, so a run
saved by N workers resumes on any number of workers, and :func:`load_consolidated` reads it into a
plain single-process model (``tvq eval``, ``tvq sample``). A run also moves between this format and the
replicated one: :func:`load_shards` fills a DDP or plain model's whole tensors, :func:`load_replicated` an FSDP
model's shards from a replicated checkpoint.

Safe loading: DCP unpickles ``.metadata`` with plain ``pickle`` and loads non-tensor entries with
``torch.load(weights_only=False)``; :class:`SafeReader` unpickles the index allowing only DCP's own
metadata classes and refuses non-tensor entries, and the checkpoint stores none (the non-tensor
optimizer state goes to state.pt), so a tampered checkpoint cannot run code here either.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from transformer_vq import fileio
from transformer_vq.train.checkpoint.errors import CheckpointError

METADATA = ".metadata"
SHARD_FILE = re.compile(r"^__\d+_\d+\.distcp$")

# The globals a DCP index may name: its own metadata records, torch's dtypes, sizes and layouts, and
# the path of the checkpoint. Nothing here runs code when called with data from the file.
_METADATA_CLASSES = frozenset({"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                               "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"})
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": _METADATA_CLASSES,
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"}),
}


class UnsafeCheckpoint(RuntimeError):
    """A DCP index that names something other than DCP's metadata, or holds non-tensor entries."""


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _ALLOWED.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                               torch.dtype)):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"its {METADATA} names {module}.{name}, which a DCP index never holds")


class SafeReader(FileSystemReader):
    """DCP's file reader with the index unpickled through an allow-list and non-tensor entries refused."""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpoint("per-rank DCP indexes are not written by transformer-vq")
        with open(Path(self.path) / METADATA, "rb") as stream:
            metadata = _IndexUnpickler(stream).load()
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise UnsafeCheckpoint(f"its {METADATA} is not a DCP index")
        other = [k for k, v in metadata.state_dict_metadata.items()
                 if not isinstance(v, dcp_metadata.TensorStorageMetadata)]
        if other:
            raise UnsafeCheckpoint(f"it holds non-tensor entries ({', '.join(sorted(other)[:3])}), which would be "
                                   f"unpickled")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def sharded_files(manifest: dict) -> list[str]:
    """The files a sharded checkpoint's manifest lists (each must be present and match it)."""
    return [METADATA, *sorted(name for name in manifest if SHARD_FILE.match(name))]


def is_sharded(manifest: dict) -> bool:
    """A checkpoint written by FSDP training (its manifest lists a DCP index)."""
    return METADATA in manifest


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list]:
    """``(tensors, param_groups)``: every worker's shards of the weights, buffers and optimizer
    state (for DCP), and the optimizer's parameter groups (plain data, the same on every worker)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": {"state": optim_state["state"]}}, optim_state["param_groups"]


def save_shards(directory: Path, tensors: dict) -> None:
    """Write this worker's shards into ``directory`` (a collective: every worker calls it)."""
    dcp.save(tensors, storage_writer=FileSystemWriter(directory, sync_files=True))


def load_shards(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, param_groups: list, *,
                no_dist: bool = False) -> None:
    """Load a sharded checkpoint into a sharded model and its optimizer, resliced for this number of
    workers (a collective); with ``no_dist``, into a replicated (plain or DDP) one, each process reading
    every shard alone: the state is keyed by parameter name either way, and whole tensors are one slice."""
    tensors, _ = sharded_state(model, optimizer)  # the shapes and shards to fill (initializes Adam's state)
    _load(path, tensors, no_dist=no_dist)
    set_state_dict(model, optimizer, model_state_dict=tensors["model"],
                   optim_state_dict={"state": tensors["optimizer"]["state"], "param_groups": param_groups})


def load_replicated(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict,
                    optimizer_state: dict) -> None:
    """Load a replicated checkpoint (DDP's or one process's: whole ``weights`` and ``optimizer.state_dict()``,
    keyed by parameter position) into a sharded model and its optimizer: every worker keeps its shard.

    Positions become names through this run's optimizer, built as the saved one was (the same parameter groups, in
    the same order); a count that differs means another optimizer layout and is refused."""
    names = {id(p): name for name, p in model.named_parameters()}
    current = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [index for group in optimizer_state["param_groups"] for index in group["params"]]
    if len(saved) != len(current):
        raise CheckpointError(f"checkpoint {path} holds optimizer state for {len(saved)} parameters and this run's "
                              f"optimizer has {len(current)}: it was saved by another version of the trainer")
    name_of = dict(zip(saved, current))
    optim = {"state": {name_of[index]: value for index, value in optimizer_state["state"].items()},
             "param_groups": [{**group, "params": [name_of[i] for i in group["params"]]}
                              for group in optimizer_state["param_groups"]]}
    try:
        set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {_first_line(err)}") from None


def load_consolidated(path: Path, model: torch.nn.Module) -> None:
    """Load the weights and buffers of a sharded checkpoint into a plain (unsharded) model, in this
    process alone: the shards of every worker are read and joined."""
    state = model.state_dict()
    _load(path, {"model": state}, no_dist=True)
    model.load_state_dict(state)


def _load(path: Path, tensors: dict, *, no_dist: bool) -> None:
    reader = SafeReader(path)
    try:  # checked here first: DCP would wrap the refusal into a generic "metadata is None" error
        reader.read_metadata()
    except (UnsafeCheckpoint, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as err:
        raise CheckpointError(f"refusing to load {path}: {_first_line(err)}; checkpoints written by transformer-vq "
                              f"never do that, only load files from sources you trust") from None
    try:
        with warnings.catch_warnings():  # DCP warns that it loads without a process group, when that is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(tensors, storage_reader=reader, no_dist=no_dist)
    except Exception as err:  # DCP reports a key or shape that does not fit in its own exception types
        raise CheckpointError(f"checkpoint {path} does not fit this model: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextlib.contextmanager
def shared_directory(final: Path, dist_info):
    """A temporary directory created by rank 0 and known to every worker, renamed to ``final`` by
    rank 0 when the block completes (:func:`transformer_vq.fileio.atomic_directory`)."""
    with (fileio.atomic_directory(final) if dist_info.is_main else contextlib.nullcontext()) as tmp:
        yield Path(dist_info.all_gather_object(str(tmp) if tmp is not None else None)[0])
