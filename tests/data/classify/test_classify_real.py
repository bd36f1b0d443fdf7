"""The real Fashion-MNIST package, end to end (slow: fetches 31 MB with apt).

Run with ``pytest -m slow tests/data/classify/test_classify_real.py`` on a machine with apt and a
network (Debian or Ubuntu; run ``apt-get update`` first).
"""

import shutil

import numpy as np
import pytest

from transformer_vq.data.classify import load_classification


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
def test_real_fashion_mnist_package():
    data = load_classification("fashion-mnist")
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [55_000, 5_000, 10_000]
    counts = np.bincount(np.concatenate([data.splits[s].labels for s in ("train", "validation")]), minlength=10)
    assert counts.tolist() == [6_000] * 10  # the release is balanced
    assert np.bincount(data.splits["test"].labels, minlength=10).tolist() == [1_000] * 10
