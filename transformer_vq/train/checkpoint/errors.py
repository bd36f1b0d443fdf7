"""The error of a checkpoint that cannot be used: a leaf, so that the store (``store.py``), the sharded format
(``dcp.py``), the run directory and their callers share it without importing each other."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with a message that says why and what to do."""
