"""Loading pickled numpy data without executing arbitrary code.

``pickle.load`` can call any importable function named in the file. :func:`load_array_pickle`
uses an unpickler that resolves only the few globals a pickled dict of numpy arrays needs
(``ndarray`` reconstruction and ``dtype``), so a file carrying a code payload is rejected before
anything runs. Containers (dicts, lists, tuples), strings, bytes and numbers need no globals.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

from transformer_vq.data.errors import DataError

# (module, name) pairs a pickled numpy array refers to. numpy 2 moved numpy.core to numpy._core;
# pickles from either era name one or the other, and both resolve to the same objects.
ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}


class ArrayUnpickler(pickle.Unpickler):
    """An unpickler that only reconstructs numpy arrays, dtypes and scalars and plain containers."""

    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}: only numpy arrays are allowed")
        if module.startswith("numpy.core"):
            # Resolve through numpy._core when it exists, avoiding numpy 2's deprecation shim.
            try:
                return getattr(importlib.import_module(module.replace("numpy.core", "numpy._core")), name)
            except ImportError:
                pass
        return getattr(importlib.import_module(module), name)


def load_array_pickle(path: str | Path, *, instead: str = "Use the .npz release files instead"):
    """Unpickle ``path`` allowing only numpy arrays and plain containers; :class:`DataError` otherwise.

    ``encoding="latin1"`` lets pickles written by Python 2 (as some dataset releases were) load.
    ``instead`` ends the message of a refused pickle: what the user can do about it.
    """
    try:
        with open(path, "rb") as handle:
            return ArrayUnpickler(handle, encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise DataError(f"{path} is not a plain pickled dict of numpy arrays ({exc}); it was not loaded. "
                        f"{instead}") from exc
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, OSError) as exc:
        raise DataError(f"cannot read {path} as a pickle ({type(exc).__name__}: {exc}); the file is corrupt or "
                        f"truncated: download it again") from exc
