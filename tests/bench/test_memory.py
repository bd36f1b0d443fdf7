"""The peak-memory reader of the benchmarks (transformer_vq/bench/memory.py) and the workers' use of it."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

import transformer_vq.bench.memory as memory
from transformer_vq import GatedAttentionUnit, preset
from transformer_vq.bench.memory import PeakMemory, peak_rss_bytes, reset_peak_rss, rss_bytes

MIB = 2**20
BIG = 256 * MIB  # large enough to stand out of the allocator's noise, small enough for a shared machine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _touch_big() -> torch.Tensor:
    """A float32 tensor of ``BIG`` bytes on fresh pages, every one written (resident).

    Its storage is an anonymous mapping of its own, not malloc's: a benchmark test earlier in this process may have
    told malloc to keep freed memory (transformer_vq.hostmem), and a tensor from a retained heap raises no RSS."""
    pages = mmap.mmap(-1, BIG)
    tensor = torch.frombuffer(pages, dtype=torch.float32)
    tensor.fill_(1.0)
    return tensor


def test_a_big_tensor_raises_the_peak_and_a_reset_forgets_it():
    assert reset_peak_rss()
    before, source = peak_rss_bytes()
    assert source == "VmHWM" and before >= rss_bytes() - MIB  # just reset: the mark is the RSS now
    big = _touch_big()
    grown, _ = peak_rss_bytes()
    assert grown - before >= 0.9 * BIG
    del big
    assert reset_peak_rss()
    # forgotten by the reset: the mark is the RSS now (which keeps the freed tensor where malloc retains memory)
    assert peak_rss_bytes()[0] <= rss_bytes() + MIB


def test_peak_memory_of_a_cell_keeps_the_highest_window():
    peak = PeakMemory()
    with peak:
        big = _touch_big()
        del big
    first = peak.figures()
    assert first["peak_rss_rise_bytes"] >= 0.9 * BIG and first["peak_rss_source"] == "VmHWM"
    with peak:  # a quiet window leaves the highest figures as they were
        torch.zeros(16)
    assert peak.figures() == first
    assert set(peak.figures("fwd_")) == {"fwd_peak_rss_bytes", "fwd_peak_rss_rise_bytes", "fwd_peak_rss_source"}


def test_without_a_resettable_mark_it_falls_back_to_the_lifetime_peak(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "_PROC_SELF", tmp_path / "nowhere")
    assert not reset_peak_rss() and rss_bytes() is None
    peak, source = peak_rss_bytes()
    assert source == "ru_maxrss" and peak > 10 * MIB  # this process imported torch
    with PeakMemory() as cell:
        pass
    assert cell.figures() == {"peak_rss_bytes": peak, "peak_rss_rise_bytes": None, "peak_rss_source": "ru_maxrss"}


def test_the_workers_timed_call_reports_its_peak():
    """benchmarks/worker_protocol.py (both sides of jax_layer.py) loads this module by path and times with it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import worker_protocol
    finally:
        sys.path.pop(0)
    seconds, peak = worker_protocol.timed(lambda: _touch_big().sum())
    assert seconds > 0 and peak["peak_rss_rise_bytes"] >= 0.9 * BIG and peak["peak_rss_source"] == "VmHWM"


def test_the_memory_profile_finds_what_autograd_saves():
    """benchmarks/memory_profile.py on a tiny unit: every saved storage counted once, each at a line of the package."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import memory_profile
    finally:
        sys.path.pop(0)
    unit = GatedAttentionUnit(preset("tiny", block_len=4, n_code=6)).eval()
    x = torch.randn(1, 16, unit.cfg.d_model)
    saved = memory_profile.saved_for_backward(unit, x)
    kinds = {t["kind"] for t in saved["tensors"]}
    assert kinds == {"activation", "parameter", "input"}
    # the silu of the gate saves its input, a [1, 16, Dv] float32 tensor made by the projection
    assert any(t["shape"] == [1, 16, unit.cfg.d_v] and t["site"].startswith("transformer_vq/models/tvq/gau.py")
               for t in saved["tensors"])
    assert saved["activation_bytes"] == sum(s["bytes"] for s in saved["sites"] if s["kind"] == "activation") > 0
