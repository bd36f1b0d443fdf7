"""Shared by the operator tests: pytest (prepend import mode) puts this directory on ``sys.path``, so the tests of
``vq/``, ``full/`` and ``flash/`` import their common inputs and checks from ``opsutil``."""
