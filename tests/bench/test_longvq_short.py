"""benchmarks/longvq_short.py runs as documented (benchmarks/README.md), at a tiny size: it crashed with a TypeError
from a call of the window path by position, with the path's arguments one slot off."""

from __future__ import annotations

import json

import pytest
import torch

from benchscripts import benchmark_script


def _script():
    return benchmark_script("longvq_short")


def test_the_script_runs_every_timing_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "short" / "tiny"
    assert _script().main(["--out", str(out), "--length", "16", "--block-len", "8", "--batch", "2",
                           "--repeats", "1", "--warmup", "0"]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert set(record["results"]) == {"attention", "ema", "step"}
    assert set(record["results"]["attention"]["medians_s"]) == {"dense path (now)", "window path (before)"}
    assert all(r["ratio"] > 0 and all(t > 0 for t in r["medians_s"].values()) for r in record["results"].values())
    assert record["shape"] == {"B": 2, "T": 16, "L": 8}
    assert "| attention | dense path (now)" in out.with_suffix(".md").read_text()
    assert "| step | longvq step" in capsys.readouterr().out


@pytest.mark.parametrize("T", [16, 13, 40])
def test_the_window_path_is_the_public_operators_attention(T):
    """What the script times as the window path is the attention of ``vq_bidir_attention`` (its dense path at
    ``T <= 2L``, this same path at ``T > 2L``), in float64, where both are exact."""
    from transformer_vq.ops.vq_bidir import vq_bidir_attention

    gen = torch.Generator().manual_seed(T)
    B, L, S = 2, 8, 5
    q, v = torch.randn(B, 1, T, 4, generator=gen).double(), torch.randn(B, 1, T, 3, generator=gen).double()
    codebook = torch.randn(1, S, 4, generator=gen).double()
    z = torch.randint(0, S, (B, 1, T), generator=gen)
    bias = torch.randn(B, 1, T, 3 * L, generator=gen).double()
    real = torch.ones(B, T, dtype=torch.bool)
    want = vq_bidir_attention(q, codebook[0][z], v, bias, block_len=L, z=z, codebook=codebook, mask=real)[0]
    got = _script().window_path(q, codebook[0][z], v, bias, L, z, codebook, real)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_window_path_that_disagrees_stops_the_timing(monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "window_path", lambda *args: torch.zeros(2, 1, 16, 8))
    with pytest.raises(AssertionError):
        script.attention_calls(2, 16, 8, 4, 4, 8)
