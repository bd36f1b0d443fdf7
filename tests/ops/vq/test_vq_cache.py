"""The cache math of Theorem 3.7 / Remark 3.9 alone: summaries, their merge, the prefix over blocks by each reduction.

Each is compared with the same quantity counted from scratch by a plain loop over keys.
"""

from __future__ import annotations

import pytest
import torch

from transformer_vq.config import REDUCTIONS
from transformer_vq.ops.vq.cache import PREFIXES, log_counts, merge, summarize

S, DV = 5, 3


def keys(n, seed):
    """``z [2, 1, n]`` codes and ``v [2, 1, n, Dv]`` float64 values of ``n`` keys."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, S, (2, 1, n), generator=gen), torch.randn(2, 1, n, DV, generator=gen, dtype=torch.float64)


def loop_summary(z, v):
    """Count and mean per code, one key at a time."""
    count = torch.zeros(*z.shape[:-1], S, dtype=torch.float32)
    total = torch.zeros(*v.shape[:-2], S, DV, dtype=torch.float64)
    for b in range(z.shape[0]):
        for g in range(z.shape[1]):
            for p in range(z.shape[2]):
                count[b, g, z[b, g, p]] += 1
                total[b, g, z[b, g, p]] += v[b, g, p]
    return count, total / count.clamp(min=1).unsqueeze(-1).double()


def test_one_prefix_function_per_reduction():
    assert sorted(PREFIXES) == sorted(REDUCTIONS)


@pytest.mark.parametrize("n", [0, 1, 13])
def test_summarize_counts_and_averages(n):
    z, v = keys(n, seed=n)
    count, mean = summarize(z, v, S, torch.float64)
    want_count, want_mean = loop_summary(z, v)
    assert count.dtype == torch.float32
    torch.testing.assert_close(count, want_count, rtol=0, atol=0)
    torch.testing.assert_close(mean, want_mean, rtol=1e-12, atol=1e-12)


def test_merge_is_the_summary_of_the_union_and_associative():
    (za, va), (zb, vb), (zc, vc) = keys(7, 1), keys(4, 2), keys(9, 3)
    a, b, c = (summarize(z, v, S, torch.float64) for z, v in ((za, va), (zb, vb), (zc, vc)))
    union = loop_summary(torch.cat([za, zb], dim=-1), torch.cat([va, vb], dim=-2))
    for got, want in zip(merge(*a, *b), union):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    left, right = merge(*merge(*a, *b), *c), merge(*a, *merge(*b, *c))
    torch.testing.assert_close(left[0], right[0], rtol=0, atol=0)
    torch.testing.assert_close(left[1], right[1], rtol=1e-12, atol=1e-12)
    empty = summarize(za[..., :0], va[..., :0, :], S, torch.float64)
    for got, want in zip(merge(*empty, *a), a):  # the empty summary is the identity
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("n_blocks", [1, 5, 8])
def test_prefix_is_the_summary_of_every_key_so_far(reduction, n_blocks):
    """Prefix ``n`` summarizes the initial keys and blocks ``0 .. n-1``, counted from scratch."""
    L = 4
    z0, v0 = keys(6, seed=10)
    z, v = keys(n_blocks * L, seed=11)
    init = summarize(z0, v0, S, torch.float64)
    counts, means = summarize(z.view(2, 1, n_blocks, L), v.view(2, 1, n_blocks, L, DV), S, torch.float64)
    prefix_count, prefix_mean = PREFIXES[reduction](*init, counts, means)
    assert prefix_count.shape == (2, 1, n_blocks + 1, S) and prefix_mean.shape == (2, 1, n_blocks + 1, S, DV)
    for n in range(n_blocks + 1):
        seen = n * L
        want_count, want_mean = loop_summary(torch.cat([z0, z[..., :seen]], -1), torch.cat([v0, v[..., :seen, :]], -2))
        torch.testing.assert_close(prefix_count[:, :, n], want_count, rtol=0, atol=0)
        torch.testing.assert_close(prefix_mean[:, :, n], want_mean, rtol=1e-12, atol=1e-12)


def test_log_counts_excludes_unused_codes():
    logs = log_counts(torch.tensor([0.0, 1.0, 4.0]), torch.bfloat16)
    assert logs.dtype == torch.float32  # at least float32 whatever the scores' dtype
    assert logs.tolist() == [float("-inf"), 0.0, pytest.approx(1.3862943611)]
