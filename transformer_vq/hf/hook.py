"""Registering with ``transformers`` whenever it is imported, without importing it (or torch) ahead of time.

``import transformer_vq`` must stay cheap: the ``tvq`` command sets its thread policy before PyTorch loads, and most
users never touch ``transformers``. So :func:`install` (called by ``transformer_vq/__init__.py``) does one of two
things:

- ``transformers`` is already in ``sys.modules`` (imported before ``transformer_vq``): register now, by importing
  :mod:`transformer_vq.hf.register`;
- otherwise: put a small finder at the front of ``sys.meta_path``. Python asks it first when ``transformers`` is
  imported; it steps aside (removes itself), lets the other finders locate the real package, and wraps the loader's
  ``exec_module`` so that :mod:`transformer_vq.hf.register` is imported right after ``transformers/__init__.py`` ran.
  By the time ``import transformers`` returns, the auto classes know the model. Every other import is left alone
  (the finder answers ``None``).

A ``transformers`` too old for this module (before 5.0) is reported by a warning, never by a failing import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

TRANSFORMERS = "transformers"
REGISTER = "transformer_vq.hf.register"


def register() -> None:
    """Register the model with ``transformers``' auto classes (imports ``transformers`` and torch)."""
    try:
        importlib.import_module(REGISTER)
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
