"""The cache of Theorem 3.7 in the running-mean form of Remark 3.9: per-code summaries and their prefixes over blocks.

Keys older than a query's two-block window enter the softmax only through their code. Per group and code ``s`` the
operator keeps the count ``c[s]`` of such keys and the mean ``m[s]`` of their values (a mean, not a sum, so nothing
carried across calls grows with the sequence). This module holds that arithmetic, and nothing else:

* :func:`summarize`: the ``(count, mean)`` summary of one run of keys;
* :func:`merge`: the associative operation combining two summaries;
* :func:`log_counts`: the ``log c[s]`` term a code adds to its score (``-inf`` for unused codes);
* the prefix over blocks ("reductions", App. B / E), one function per entry of ``transformer_vq.config.REDUCTIONS``:
  :func:`prefix_serial` (a scan), :func:`prefix_matmul` (a lower-triangular weighted product), :func:`prefix_assoc`
  (an associative scan), gathered in ``PREFIXES``.

Letters: B batch, G key/value groups, N blocks, S codewords, Dv value width, W keys of a run.
"""

from __future__ import annotations

import torch


def merge(count_a, mean_a, count_b, mean_b):
    """Merge two per-code summaries; the mean is a convex combination, so it stays bounded.

    Counts are whole numbers, so a non-zero total is >= 1 and clamping at 1 only guards 0 / 0.
    ``mean_a (c_a / c) + mean_b (c_b / c) = mean_a + (mean_b - mean_a) (c_b / c)``: one fused ``lerp`` pass
    over the ``[S, Dv]`` means instead of four (the scan is bound by memory traffic, not arithmetic).
    """
    count = count_a + count_b
    total = count.clamp(min=1.0).to(mean_a.dtype)  # ratios in the means' precision (float64 stays exact)
    return count, torch.lerp(mean_a, mean_b.to(mean_a.dtype), (count_b.to(mean_a.dtype) / total).unsqueeze(-1))


def summarize(z: torch.Tensor, v: torch.Tensor, n_code: int, acc_dtype: torch.dtype):
    """Count and mean of values per code over the second-to-last axis.

    Args:
        z: ``[..., W]`` shortcodes. v: ``[..., W, Dv]`` values.
    Returns:
        ``count [..., S]`` (float32) and ``mean [..., S, Dv]`` (``acc_dtype``; 0 for unused codes).
    """
    count = torch.zeros(*z.shape[:-1], n_code, dtype=torch.float32, device=z.device)
    count.scatter_add_(-1, z, torch.ones(z.shape, dtype=torch.float32, device=z.device))
    # In place into fresh zeros: the out-of-place scatter_add would first copy them.
    sums = torch.zeros(*v.shape[:-2], n_code, v.shape[-1], dtype=acc_dtype, device=v.device)
    sums.scatter_add_(-2, z.unsqueeze(-1).expand(*z.shape, v.shape[-1]), v.to(acc_dtype))
    return count, sums / count.clamp(min=1.0).unsqueeze(-1).to(acc_dtype)


def log_counts(count: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``log c`` (in at least float32) with ``-inf`` for unused codes, which then get exactly zero weight."""
    count = count.to(torch.promote_types(dtype, torch.float32))
    return torch.where(count > 0, count.clamp(min=1.0).log(), torch.full_like(count, float("-inf")))


# Each prefix function takes the initial summary ``(B, G, S)``, ``(B, G, S, Dv)`` and the per-block summaries
# ``(B, G, N, S)``, ``(B, G, N, S, Dv)``, and returns the N + 1 prefixes ``(B, G, N + 1, S)``,
# ``(B, G, N + 1, S, Dv)``: index 0 is the initial summary, index n + 1 the merge through block n.


def prefix_serial(init_count, init_mean, counts, means):
    """Prefix merges over blocks (axis 2), one block at a time; one stack of the prefixes (with the initial one)."""
    prefix_counts, prefix_means = [init_count], [init_mean]
    # unbind, not indexing: the backward of N index ops would build N full-size zero gradients.
    for block_count, block_mean in zip(counts.unbind(2), means.unbind(2)):
        count, mean = merge(prefix_counts[-1], prefix_means[-1], block_count, block_mean)
        prefix_counts.append(count)
        prefix_means.append(mean)
    return torch.stack(prefix_counts, dim=2), torch.stack(prefix_means, dim=2)


def prefix_matmul(init_count, init_mean, counts, means):
    """Prefix merges as one product with a lower-triangular matrix of ones, over all codes at once.

    ``mean_n = (c_init m_init + sum_{i <= n} c_i m_i) / C_n``: the per-block sums ``c_i m_i`` (each bounded by ``L``
    times the largest value) are accumulated by one ``(N, N) x (N, S Dv)`` matmul, the form of FLASH's
    lower-triangular matmul that runs at matmul speed, and divided by the running counts; the carried summary
    enters as its mean times ``c_init / C_n``, so nothing carried across calls grows with the sequence.
    """
    B, G, N, S = counts.shape
    Dv = means.shape[-1]
    totals = init_count.unsqueeze(2) + counts.cumsum(dim=2)  # (B, G, N, S)
    safe = totals.clamp(min=1.0).to(means.dtype)
    lower = torch.ones(N, N, dtype=means.dtype, device=counts.device).tril()  # [n, i]: i <= n
    sums = means * counts.to(means.dtype).unsqueeze(-1)  # (B, G, N, S, Dv)
    prefix = (lower @ sums.reshape(B * G, N, S * Dv)).view(B, G, N, S, Dv)
    mean = (prefix + (init_count.to(means.dtype).unsqueeze(-1) * init_mean).unsqueeze(2)) / safe.unsqueeze(-1)
    return _with_init(init_count, init_mean, totals, mean)


def prefix_assoc(init_count, init_mean, counts, means):
    """Inclusive prefix merge by an associative (Hillis-Steele) scan: log2(N) rounds of merges."""
    first_count, first_mean = merge(init_count, init_mean, counts[:, :, 0], means[:, :, 0])
    count = torch.cat([first_count.unsqueeze(2), counts[:, :, 1:]], dim=2)
    mean = torch.cat([first_mean.unsqueeze(2), means[:, :, 1:]], dim=2)
    N = counts.shape[2]
    step = 1
    while step < N:
        merged_count, merged_mean = merge(count[:, :, :-step], mean[:, :, :-step], count[:, :, step:], mean[:, :, step:])
        count = torch.cat([count[:, :, :step], merged_count], dim=2)
        mean = torch.cat([mean[:, :, :step], merged_mean], dim=2)
        step *= 2
    return _with_init(init_count, init_mean, count, mean)


def _with_init(init_count, init_mean, counts, means):
    """Prefixes ``[init, through block 0, ..., through block N-1]`` from the inclusive ones (axis 2)."""
    return (torch.cat([init_count.unsqueeze(2), counts], dim=2), torch.cat([init_mean.unsqueeze(2), means], dim=2))


PREFIXES = {"serial": prefix_serial, "matmul": prefix_matmul, "assoc": prefix_assoc}
"""One prefix function per entry of ``transformer_vq.config.REDUCTIONS``."""
