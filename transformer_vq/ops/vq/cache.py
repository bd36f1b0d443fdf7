"""The cache of Theorem 3.7 in the running-mean form of Remark 3.9: per-code summaries and their prefixes over blocks.

Keys older than a query's two-block window enter the softmax only through their code. Per group and code ``s`` the
operator keeps the count ``c[s]`` of such keys and the mean ``m[s]`` of their values (a mean, not a sum, so nothing
carried across calls grows with the sequence). This module holds that arithmetic, and nothing else:

* :func:`summarize`: the ``(count, mean)`` summary of one run of keys;
* :func:`merge`: the associative operation combining two summaries; :func:`restart`: the empty summary where a
  packed document begins (the prefixes below then become segmented scans);
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


def summarize(z: torch.Tensor, v: torch.Tensor, n_code: int, acc_dtype: torch.dtype,
              weight: torch.Tensor | None = None):
    """Count and mean of values per code over the second-to-last axis.

    Args:
        z: ``[..., W]`` shortcodes. v: ``[..., W, Dv]`` values.
        weight: ``[..., W]`` 0 or 1 (broadcast over the leading axes): which keys count (packed documents keep the
            keys after the last document start of a block); ``None``: every key.
    Returns:
        ``count [..., S]`` (float32) and ``mean [..., S, Dv]`` (``acc_dtype``; 0 for unused codes).
    """
    count, sums = summed(z, v, n_code, acc_dtype, weight)
    return count, per_code_mean(count, sums)


def per_code_mean(count: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """``sums [..., S, Dv]`` divided by ``count [..., S]``, in place (0 for unused codes); returns ``sums``. In place:
    the sums of :func:`summed` are a fresh tensor, and the division's backward needs only the count."""
    return sums.div_(count.clamp(min=1.0).unsqueeze(-1).to(sums.dtype))


def summed(z: torch.Tensor, v: torch.Tensor, n_code: int, acc_dtype: torch.dtype,
           weight: torch.Tensor | None = None):
    """Count and sum of values per code over the second-to-last axis: :func:`summarize` before its division
    (``count [..., S]`` float32, ``sums [..., S, Dv]`` in ``acc_dtype``)."""
    ones = torch.ones(z.shape, dtype=torch.float32, device=z.device)
    if weight is not None:
        ones = ones * weight.to(torch.float32)
        v = v * weight.to(v.dtype).unsqueeze(-1)
    count = torch.zeros(*z.shape[:-1], n_code, dtype=torch.float32, device=z.device)
    count.scatter_add_(-1, z, ones)
    # In place into fresh zeros: the out-of-place scatter_add would first copy them.
    sums = torch.zeros(*v.shape[:-2], n_code, v.shape[-1], dtype=acc_dtype, device=v.device)
    sums.scatter_add_(-2, z.unsqueeze(-1).expand(*z.shape, v.shape[-1]), v.to(acc_dtype))
    return count, sums


def restart(count, mean, keep):
    """The summary where ``keep`` is True, the empty one where it is False (a document began): ``keep`` is ``[B]``, the
    summary ``[B, ...]``. The mean is zeroed too, so an empty summary is exactly zeros whatever came before."""
    keep_count = keep.to(count.dtype).view(-1, *[1] * (count.dim() - 1))
    return count * keep_count, mean * keep.to(mean.dtype).view(-1, *[1] * (mean.dim() - 1))


def log_counts(count: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``log c`` (in at least float32) with ``-inf`` for unused codes, which then get exactly zero weight."""
    count = count.to(torch.promote_types(dtype, torch.float32))
    return torch.where(count > 0, count.clamp(min=1.0).log(), torch.full_like(count, float("-inf")))


# Each prefix function takes the initial summary ``(B, G, S)``, ``(B, G, S, Dv)``, the per-block summaries
# ``(B, G, N, S)``, ``(B, G, N, S, Dv)`` and ``keep`` (``None``, or ``(B, N)`` bool, False where a document begins in
# the block: the summary before it is dropped, a segmented scan), and returns the N + 1 prefixes ``(B, G, N + 1, S)``,
# ``(B, G, N + 1, S, Dv)``: index 0 is the initial summary, index n + 1 the merge through block n.


def prefix_serial(init_count, init_mean, counts, means, keep=None):
    """Prefix merges over blocks (axis 2), one block at a time; one stack of the prefixes (with the initial one)."""
    prefix_counts, prefix_means = [init_count], [init_mean]
    # unbind, not indexing: the backward of N index ops would build N full-size zero gradients.
    for n, (block_count, block_mean) in enumerate(zip(counts.unbind(2), means.unbind(2))):
        count, mean = prefix_counts[-1], prefix_means[-1]
        if keep is not None:
            count, mean = restart(count, mean, keep[:, n])
        count, mean = merge(count, mean, block_count, block_mean)
        prefix_counts.append(count)
        prefix_means.append(mean)
    return torch.stack(prefix_counts, dim=2), torch.stack(prefix_means, dim=2)


def prefix_matmul(init_count, init_mean, counts, means, keep=None):
    """Prefix merges as one product with a lower-triangular matrix of ones, over all codes at once.

    ``mean_n = (c_init m_init + sum_{i <= n} c_i m_i) / C_n``: the per-block sums ``c_i m_i`` (each bounded by ``L``
    times the largest value) are accumulated by one ``(N, N) x (N, S Dv)`` matmul, the form of FLASH's
    lower-triangular matmul that runs at matmul speed, and divided by the running counts; the carried summary
    enters as its mean times ``c_init / C_n``, so nothing carried across calls grows with the sequence. With
    ``keep``, entry ``[n, i]`` of the matrix is 1 only when no document begins in blocks ``i+1 .. n`` (one matrix
    per row), and the carried summary only while none has begun.
    """
    B, G, N, S = counts.shape
    Dv = means.shape[-1]
    lower = torch.ones(N, N, dtype=means.dtype, device=counts.device).tril()  # [n, i]: i <= n
    init_weight = torch.ones(1, N, dtype=means.dtype, device=counts.device)  # (1 or B, N)
    if keep is not None:
        restarts = (~keep).to(torch.long).cumsum(dim=1)  # (B, N): documents begun through block n
        lower = lower * (restarts[:, :, None] == restarts[:, None, :]).to(means.dtype)  # (B, N, N)
        init_weight = (restarts == 0).to(means.dtype)
    lower = lower.view(-1, 1, N, N)  # (1 or B, 1, N, N): one matrix for every group
    if keep is None:
        totals = init_count.unsqueeze(2) + counts.cumsum(dim=2)  # (B, G, N, S)
    else:  # whole numbers: the product sums them exactly
        totals = lower.to(counts.dtype) @ counts + init_count.unsqueeze(2) * init_weight[:, None, :, None].to(
            counts.dtype)
    safe = totals.clamp(min=1.0).to(means.dtype)
    sums = means * counts.to(means.dtype).unsqueeze(-1)  # (B, G, N, S, Dv)
    prefix = (lower @ sums.reshape(B, G, N, S * Dv)).view(B, G, N, S, Dv)
    carried = (init_count.to(means.dtype).unsqueeze(-1) * init_mean).unsqueeze(2)  # (B, G, 1, S, Dv)
    mean = (prefix + carried * init_weight[:, None, :, None, None]) / safe.unsqueeze(-1)
    return _with_init(init_count, init_mean, totals, mean)


def prefix_assoc(init_count, init_mean, counts, means, keep=None):
    """Inclusive prefix merge by an associative (Hillis-Steele) scan: log2(N) rounds of merges.

    With ``keep``, each element carries whether a document begins in its span, and merging drops the left summary
    when one begins in the right span: ``(c, m, f) . (c', m', f') = (f' ? (c', m') : merge(c, m, c', m'), f or f')``,
    associative, so the rounds stay those of the plain scan.
    """
    first = init_count, init_mean
    if keep is not None:
        first = restart(init_count, init_mean, keep[:, 0])
    first_count, first_mean = merge(*first, counts[:, :, 0], means[:, :, 0])
    count = torch.cat([first_count.unsqueeze(2), counts[:, :, 1:]], dim=2)
    mean = torch.cat([first_mean.unsqueeze(2), means[:, :, 1:]], dim=2)
    N = counts.shape[2]
    span_keep = None if keep is None else torch.cat([torch.zeros_like(keep[:, :1]), keep[:, 1:]], dim=1)
    step = 1
    while step < N:
        left_count, left_mean = count[:, :, :-step], mean[:, :, :-step]
        if span_keep is not None:
            right_keep = span_keep[:, step:]  # (B, N - step)
            left_count = left_count * right_keep[:, None, :, None].to(count.dtype)
            left_mean = left_mean * right_keep[:, None, :, None, None].to(mean.dtype)
            span_keep = torch.cat([span_keep[:, :step], span_keep[:, :-step] & right_keep], dim=1)
        merged_count, merged_mean = merge(left_count, left_mean, count[:, :, step:], mean[:, :, step:])
        count = torch.cat([count[:, :, :step], merged_count], dim=2)
        mean = torch.cat([mean[:, :, :step], merged_mean], dim=2)
        step *= 2
    return _with_init(init_count, init_mean, count, mean)


def _with_init(init_count, init_mean, counts, means):
    """Prefixes ``[init, through block 0, ..., through block N-1]`` from the inclusive ones (axis 2)."""
    return (torch.cat([init_count.unsqueeze(2), counts], dim=2), torch.cat([init_mean.unsqueeze(2), means], dim=2))


PREFIXES = {"serial": prefix_serial, "matmul": prefix_matmul, "assoc": prefix_assoc}
"""One prefix function per entry of ``transformer_vq.config.REDUCTIONS``."""
