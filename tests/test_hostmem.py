"""Host memory kept for reuse (transformer_vq.hostmem): a large tensor freed and allocated again is not page-faulted
afresh once it is on; training on a CPU and the benchmarks' cells turn it on unless told not to."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from transformer_vq.bench.config import OpBenchConfig, TrainBenchConfig
from transformer_vq.bench.isolate import host_options
from transformer_vq.config import TrainConfig
from transformer_vq.config.classify import ClassifyTrainConfig
from transformer_vq.train import device as train_device

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")

# Allocates, fills and frees a 256 MiB tensor twelve times; prints the minor page faults of the last two. (glibc
# reuses a freed block only once a few are free: a 64-byte-aligned request is a little larger than the block freed.)
_FAULTS = """
import resource, sys, torch
from transformer_vq.hostmem import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
for cycle in range(12):
    if cycle == 10:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(2**26)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@glibc
def test_a_freed_large_tensor_is_reused_without_page_faults():
    """glibc maps a 256 MiB block afresh (65,536 pages of 4 KiB to fault in, each time); retained, it stays in the
    heap and is reused."""
    assert _faults("default") > 2 * 60000
    assert _faults("retain") < 6000


# Frees a 3 GiB tensor (its pages at the top of the heap) and prints the RSS afterwards, in GiB.
_TOP = """
import sys, torch
from transformer_vq.bench.memory import rss_bytes
from transformer_vq.hostmem import retain_freed_memory
assert retain_freed_memory()
big = torch.ones(3 * 2**28)
del big
print(rss_bytes() / 2**30)
"""


@glibc
def test_a_freed_heap_top_above_2_gib_is_kept():
    """glibc trims a free heap top larger than the trim threshold; a threshold of 2 GiB (the largest positive int
    mallopt takes) gave a 131k-token training step's 6 GiB back to the kernel after every step."""
    out = subprocess.run([sys.executable, "-c", _TOP], capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[-1]) > 3


@pytest.mark.parametrize("config", [TrainConfig, ClassifyTrainConfig], ids=["train", "classify"])
def test_training_on_a_cpu_retains_host_memory_unless_told_not_to(monkeypatch, config):
    calls = []
    monkeypatch.setattr(train_device, "retain_freed_memory", lambda: calls.append(1) or True)
    threads = torch.get_num_threads()
    try:
        assert train_device.training_device(config(device="cpu", threads=1)) == torch.device("cpu")
        assert calls == [1] and torch.get_num_threads() == 1
        train_device.training_device(config(device="cpu", retain_host_memory=False))
        assert calls == [1]
    finally:
        torch.set_num_threads(threads)


def test_benchmark_cells_retain_host_memory_on_a_cpu_only():
    assert host_options(TrainBenchConfig()) == {"device": "cpu", "mem_limit_gib": 16.0, "retain_memory": True}
    assert host_options(OpBenchConfig(retain_host_memory=False, mem_limit_gib=0)) == {"device": "cpu",
                                                                                      "mem_limit_gib": None,
                                                                                      "retain_memory": False}
    assert host_options(OpBenchConfig(device="cuda")) == {"device": "cuda", "mem_limit_gib": None,
                                                          "retain_memory": False}
