"""Registering with ``transformers`` whenever it is imported, without importing it (or torch) ahead of time.

``import transformer_vq`` must stay cheap: the ``tvq`` command sets its thread policy before PyTorch loads, and most
users never touch ``transformers``. So :func:`install` (called by ``transformer_vq/__init__.py``) does one of two
things:

- ``transformers`` is already in ``sys.modules`` (imported before ``transformer_vq``): register now;
- otherwise: put a small finder at the front of ``sys.meta_path``. Python asks it first when ``transformers`` is
  imported; it steps aside (removes itself), lets the other finders locate the real package, and wraps the loader's
  ``exec_module`` so that registration runs right after ``transformers/__init__.py`` did. By the time
  ``import transformers`` returns, the auto classes know the model. Every other import is left alone (the finder
  answers ``None``).

Registering is importing :mod:`transformer_vq.hf.modeling`, whose last lines call the auto classes' ``register``.
One case needs care: when the first import of ``transformers`` comes from one of this package's own modules
(``from transformer_vq.hf.configuration import ...`` in a fresh process), that module is half-built when the finder
fires and ``modeling`` could not import it. The finder then does nothing, and the module finishes the job itself:
``configuration`` and ``cache`` end by importing ``modeling``, and ``modeling`` ends by registering.

A ``transformers`` too old for these modules (before 5.0) is reported by a warning, never by a failing import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

TRANSFORMERS = "transformers"
MODELING = "transformer_vq.hf.modeling"
# The modules that import transformers; each one registers by itself when it is the one importing it first.
OWN_MODULES = ("transformer_vq.hf.configuration", "transformer_vq.hf.cache", MODELING)


def is_initializing(name: str) -> bool:
    """Whether module ``name`` is being imported right now (in ``sys.modules`` but not finished)."""
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def register() -> None:
    """Register the model with ``transformers``' auto classes (imports ``transformers`` and torch)."""
    if any(is_initializing(name) for name in OWN_MODULES):
        return  # that module is importing transformers and registers once it is complete (module docstring)
    try:
        importlib.import_module(MODELING)
    except ImportError as err:
        warnings.warn(f"transformer_vq: could not register with transformers ({err}); install a supported version "
                      f"with `pip install transformer-vq[hf]`", stacklevel=2)


class RegisterAfterImport(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself: it makes the import of ``transformers`` end by calling :func:`register`."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TRANSFORMERS:
            return None
        sys.meta_path.remove(self)  # once is enough; and find_spec below must not come back here
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            register()

        spec.loader.exec_module = exec_then_register  # this spec's own loader object: no other module sees it
        return spec


def install() -> None:
    """Register now if ``transformers`` is loaded, else as soon as it is (see the module docstring)."""
    if TRANSFORMERS in sys.modules:
        register()
    elif not any(isinstance(finder, RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterImport())
