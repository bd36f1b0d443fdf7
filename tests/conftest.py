"""Test-suite wide hooks: tests marked ``gpu`` need CUDA and are skipped on a machine without it."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker 'gpu'); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
