"""Fixtures of the GPU tests (every test here is marked ``gpu`` and skipped without CUDA: see tests/conftest.py).

The GPU tests train like tests/train does: its helpers (trainutil: the tiny corpus and run config, ``torchrun``) and
its fixtures of the corpus and the data cache are used from there rather than copied.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"
sys.path.insert(0, str(TRAIN_TESTS))

_spec = importlib.util.spec_from_file_location("train_tests_conftest", TRAIN_TESTS / "conftest.py")
_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_train)
_isolated_cache, corpus_file = _train._isolated_cache, _train.corpus_file
