"""What the command line does with an exception: one line for the user, or a traceback for a bug.

- user errors (a bad flag, config, data or checkpoint): ``error: ...`` naming the flag, path or value, exit 2;
- environment problems (a full, read-only or missing disk, no memory, no CUDA): ``error: ...`` saying what and,
  when the message has it, how much, exit 2;
- anything else is a bug in the library: its traceback is shown (Python's exit status 1).
"""

from __future__ import annotations

import errno
import re
import sys

# What to do about each operating-system error a run can meet while writing or reading files.
OS_HINTS = {
    errno.ENOSPC: "free some space or write elsewhere (e.g. --run-dir on another disk)",
    errno.EDQUOT: "free some space or write elsewhere (e.g. --run-dir on another disk)",
    errno.EACCES: "check the permissions, or write elsewhere (e.g. --run-dir)",
    errno.EPERM: "check the permissions, or write elsewhere (e.g. --run-dir)",
    errno.EROFS: "the file system is read-only; write elsewhere (e.g. --run-dir)",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EISDIR: "the path is a directory where a file was expected; choose another path",
    errno.ENOENT: "check the path",
    errno.EEXIST: "remove it or choose another path",
}
MEMORY_WORDS = ("can't allocate memory", "out of memory", "cannot allocate memory")
PEER_WORDS = ("connection closed by peer", "connection reset by peer")
TIMEOUT_WORDS = ("timed out", "timeout")
NO_CUDA_WORDS = ("no nvidia driver", "no cuda gpus are available", "cuda driver", "torch not compiled with cuda")


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user. Only modules already imported can have raised one, so
    looking them up in ``sys.modules`` imports nothing (torch stays unloaded for ``--help``)."""
    from transformer_vq.config import ConfigError

    found = [ConfigError, ValueError]
    for module, name in (("transformer_vq.data.errors", "DataError"),
                         ("transformer_vq.train.checkpoint.errors", "CheckpointError")):
        if module in sys.modules:
            found.append(getattr(sys.modules[module], name))
    return tuple(found)


MEMORY_HINT = "use a smaller model, batch_size or seq_len"
"""What a command that met an out-of-memory error can change, unless its module says better (``MEMORY_HINT``)."""


def describe(err: BaseException, memory_hint: str | None = None) -> str | None:
    """The one line shown for a user error or an environment problem; None for a bug. ``memory_hint``: what the
    command's own flags can do about memory (default :data:`MEMORY_HINT`)."""
    from transformer_vq.config import ConfigError
    from transformer_vq.config.fields import one_line
    from transformer_vq.config.flags import flag_message

    if isinstance(err, ConfigError):
        return flag_message(err)
    if isinstance(err, OSError) and not isinstance(err, (ConnectionError, TimeoutError)):
        return _os_message(err)
    if isinstance(err, MemoryError):
        return f"out of memory; {memory_hint or MEMORY_HINT}, or a machine with more memory"
    if isinstance(err, RuntimeError):
        text = str(err).lower()
        if any(w in text for w in MEMORY_WORDS):
            amount = re.search(r"allocate (?:memory: you tried to allocate )?([\d.,]+ ?(?:[KMGT]i?B|bytes)?)",
                               str(err), re.I)
            how_much = f" (tried to allocate {amount.group(1).strip()})" if amount else ""
            return f"out of memory{how_much}; {memory_hint or MEMORY_HINT}, or a device with more memory"
        if any(w in text for w in NO_CUDA_WORDS):
            return "CUDA is not usable on this machine; use --device cpu"
        if _collective_timeout(err, text):
            waited = re.search(r"waiting (\d+) ?ms|timeout\(ms\)=(\d+)", str(err), re.I)  # gloo's, NCCL's
            after = f" after {int(waited.group(1) or waited.group(2)) / 1000:g} s" if waited else ""
            return (f"a collective between the workers of this torchrun run timed out{after}: another worker stalled "
                    f"(stopped, hung, or far slower); the last checkpoint resumes with --resume auto, and "
                    f"--collective-timeout SECONDS sets the wait")
        if _lost_peer(err, text):
            return ("another worker of this torchrun run stopped (it failed or was killed: the connection to it "
                    "closed); torchrun's report names it; the last checkpoint resumes with --resume auto")
    if isinstance(err, user_error_types()):
        return one_line(str(err)) or type(err).__name__
    return None


def _class_names(err: BaseException) -> set[str]:
    """The names of ``err``'s classes and their bases: torch.distributed's errors are told by name, so that torch is
    not imported to tell them."""
    return {kind.__name__ for kind in type(err).__mro__}


def _collective_timeout(err: RuntimeError, text: str) -> bool:
    """Whether a collective gave up waiting for another worker: gloo's "Timed out waiting ...ms for recv operation",
    NCCL's watchdog "collective operation timeout" (a DistBackendError). By name: torch is not imported for this."""
    return ("gloo" in text or "nccl" in text or "DistBackendError" in _class_names(err)) and \
        any(w in text for w in TIMEOUT_WORDS)


def _lost_peer(err: RuntimeError, text: str) -> bool:
    """Whether a collective failed because another worker is gone: gloo's "Connection closed/reset by peer", or
    torch.distributed's own backend and network errors (NCCL's). By name: torch is not imported for this."""
    return bool(_class_names(err) & {"DistBackendError", "DistNetworkError"}) or (
        "gloo" in text and any(w in text for w in PEER_WORDS))


def _os_message(err: OSError) -> str:
    where = err.filename if err.filename is not None else ""
    what = err.strerror or str(err)
    hint = OS_HINTS.get(err.errno, "check the path and the disk")
    if where and "--run-dir" in hint and _in_data_cache(where):
        # --run-dir does not move the data cache, whose files a run writes before its own
        from transformer_vq.data.cache import ENV_VAR

        hint = hint.replace("--run-dir", f"{ENV_VAR}, the data cache's directory")
    return f"{what}: {where}; {hint}" if where else f"{what}; {hint}"


def _in_data_cache(path) -> bool:
    """Whether ``path`` lies in the data cache (``$TVQ_CACHE_DIR`` or its default)."""
    from pathlib import Path

    from transformer_vq.data.cache import cache_root

    root = cache_root().resolve()
    return Path(path).expanduser().resolve().is_relative_to(root)


def check_device(name: str, model=None) -> None:
    """Refuse ``--device cuda`` on a machine without a usable CUDA GPU, and a ``model`` config whose
    ``attn_backend`` cannot run on the device here (imports torch: call it from ``run``, before anything is
    created)."""
    import torch

    from transformer_vq.config import ConfigError

    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: cuda was requested but no CUDA GPU is available; use --device cpu (or auto)")
    if getattr(model, "attn_backend", "eager") == "triton":
        from transformer_vq.ops.vq.attention import triton_problem
        from transformer_vq.train.device import resolve_device

        problem = triton_problem(resolve_device(name))
        if problem is not None:
            raise ConfigError(f"--attn-backend: {problem}")
