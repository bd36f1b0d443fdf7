"""Test-suite wide hooks: tests marked ``gpu`` need CUDA and are skipped on a machine without it; without CUDA,
Triton kernels run under Triton's interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Read when a Triton function is decorated, i.e. when triton.language is first imported (it holds jit'd helpers
    # such as tl.cdiv): it must be set before any test module, or anything they import, imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker 'gpu'); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
