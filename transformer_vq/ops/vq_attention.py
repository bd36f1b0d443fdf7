"""Linear-time VQ attention: Theorem 3.7 of the paper, in the running-mean form of Remark 3.9.

Tensor letters: B batch, H query heads, G key/value groups (query head h reads group h // (H // G)),
R = H // G heads per group, T tokens in this call, L block length, N blocks, S codewords,
Dk key width, Dv value width.

A query in block n attends
  * the keys of blocks n-1 and n directly, with the per-(query, offset) window bias and the causal mask;
  * every older key through its code only: per group and code s, the count c[s] of such keys and the
    running mean m[s] of their values. Code s contributes ``exp(q . C_s + log c[s]) * m[s]`` to the
    numerator and ``exp(q . C_s + log c[s])`` to the normalizer, which equals the sum over those keys of
    ``exp(q . k_hat_p) v_p`` because every such key has ``k_hat_p = C_s`` exactly.
One max, under stop-gradient, is subtracted from the three score sets before exponentiating, and the
normalizer sums all three. The cost per query is O((S + 2L)(Dk + Dv)) whatever the position.

Gradients: with respect to ``q``, ``v`` and ``bias`` they equal those of the dense formula
(:func:`transformer_vq.ops.reference.vq_attention_reference`). With respect to ``k_hat`` they flow only
through the keys of the two-block window: older keys enter through the codebook, which carries no
gradient. This is the paper's approximation (Sec. 3.4, the explainer's "gradient truncation"), not a bug.

A call processes the new tokens in at most three segments, each by one of two kernels:
``_attend_within_block`` for queries that all lie in one block (the head of a call that starts
mid-block, a short tail, and single-token decoding), and ``_attend_blocks`` for whole blocks in parallel,
where the per-block cache is accumulated across blocks by one of three reductions (App. B / E).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

REDUCTIONS = ("serial", "matmul", "assoc")


@dataclass
class VQAttentionState:
    """What the operator carries between calls on consecutive pieces of the same sequences.

    With ``n = offset // L`` the block of the next query, keys at positions ``< (n - 1) L`` are
    summarized per code in ``cache_count`` / ``cache_mean``; the keys of positions
    ``[max(0, (n - 1) L), offset)`` (at most ``2L - 1`` of them) are kept verbatim in ``recent_*``.
    """

    offset: int
    """Number of tokens consumed so far."""
    cache_count: torch.Tensor
    """``[B, G, S]`` float32: number of summarized keys per code."""
    cache_mean: torch.Tensor
    """``[B, G, S, Dv]``: mean of the values of the summarized keys per code (0 where the count is 0)."""
    recent_k: torch.Tensor
    """``[B, G, W, Dk]``: keys of the not-yet-summarized positions."""
    recent_v: torch.Tensor
    """``[B, G, W, Dv]``: their values."""
    recent_z: torch.Tensor
    """``[B, G, W]`` int64: their shortcodes."""

    @classmethod
    def empty(cls, batch: int, groups: int, n_code: int, d_k: int, d_v: int, *, dtype: torch.dtype,
              device: torch.device | str | None = None) -> "VQAttentionState":
        """The state of a sequence with no tokens yet."""
        acc_dtype = torch.promote_types(dtype, torch.float32)
        return cls(
            offset=0,
            cache_count=torch.zeros(batch, groups, n_code, dtype=torch.float32, device=device),
            cache_mean=torch.zeros(batch, groups, n_code, d_v, dtype=acc_dtype, device=device),
            recent_k=torch.zeros(batch, groups, 0, d_k, dtype=dtype, device=device),
            recent_v=torch.zeros(batch, groups, 0, d_v, dtype=dtype, device=device),
            recent_z=torch.zeros(batch, groups, 0, dtype=torch.long, device=device),
        )

    def detach(self) -> "VQAttentionState":
        """A copy cut from the autograd graph (truncated backprop between training windows)."""
        return VQAttentionState(
            self.offset, *(getattr(self, f.name).detach() for f in fields(self) if f.name != "offset")
        )

    def nbytes(self) -> int:
        """Memory held by the state's tensors, in bytes."""
        return sum(
            getattr(self, f.name).numel() * getattr(self, f.name).element_size()
            for f in fields(self) if f.name != "offset"
        )


def vq_attention(
    q: torch.Tensor,
    k_hat: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    codebook: torch.Tensor,
    bias: torch.Tensor,
    *,
    block_len: int,
    state: VQAttentionState | None = None,
    reduction: str = "serial",
) -> tuple[torch.Tensor, VQAttentionState]:
    """Causal softmax attention over all past keys, in time linear in the sequence length.

    Args:
        q: ``[B, H, T, Dk]`` queries.
        k_hat: ``[B, G, T, Dk]`` quantized keys, equal in value to ``codebook[g, z]``.
        z: ``[B, G, T]`` int64 shortcodes, ``0 <= z < S``.
        v: ``[B, G, T, Dv]`` values.
        codebook: ``[G, S, Dk]`` codewords (treated as constants: no gradient flows to them).
        bias: ``[B, H, T, 2L]`` bias of each query to the keys of its two-block window: column ``j`` is
            the key at absolute position ``(tau // L - 1) * L + j`` for the query at position ``tau``.
        block_len: ``L``.
        state: what the previous call on the same sequences returned (``None``: start of sequence).
        reduction: how per-block cache summaries are accumulated across blocks: ``"serial"`` (a scan),
            ``"matmul"`` (a lower-triangular weighted product) or ``"assoc"`` (an associative scan).

    Returns:
        ``(out, state)``: ``out`` is ``[B, H, T, Dv]``; ``state`` continues the sequences.
    """
    _check_inputs(q, k_hat, z, v, codebook, bias, block_len, reduction)
    B, H, T, Dk = q.shape
    G, S = codebook.shape[0], codebook.shape[1]
    L = block_len
    if state is None:
        state = VQAttentionState.empty(B, G, S, Dk, v.shape[-1], dtype=v.dtype, device=v.device)
    codebook = codebook.detach()

    outs = []
    start = 0
    while start < T:
        in_block = state.offset % L
        if in_block != 0 or T - start < L:
            stop = start + min(L - in_block, T - start)
            kernel = _attend_within_block
        else:
            stop = start + (T - start) // L * L
            kernel = _attend_blocks
        piece = slice(start, stop)
        out, state = kernel(
            q[:, :, piece], k_hat[:, :, piece], z[:, :, piece], v[:, :, piece], codebook,
            bias[:, :, piece], L, state, reduction,
        )
        outs.append(out)
        start = stop
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), state


def _check_inputs(q, k_hat, z, v, codebook, bias, block_len, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if not isinstance(block_len, int) or block_len < 1:
        raise ValueError(f"block_len must be a positive integer, got {block_len!r}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, T, Dk], got shape {tuple(q.shape)}")
    B, H, T, Dk = q.shape
    if T < 1:
        raise ValueError("q must hold at least one position (T >= 1)")
    if codebook.dim() != 3:
        raise ValueError(f"codebook must be [G, S, Dk], got shape {tuple(codebook.shape)}")
    G, S, _ = codebook.shape
    if H % G != 0:
        raise ValueError(f"number of query heads H={H} must be a multiple of key/value groups G={G}")
    expected = {
        "k_hat": (k_hat, (B, G, T, Dk)),
        "z": (z, (B, G, T)),
        "v": (v, (B, G, T, v.shape[-1] if v.dim() == 4 else -1)),
        "codebook": (codebook, (G, S, Dk)),
        "bias": (bias, (B, H, T, 2 * block_len)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for q of shape {tuple(q.shape)}, got {tuple(tensor.shape)}")
    if z.dtype != torch.long:
        raise ValueError(f"z must be int64 shortcodes, got {z.dtype}")


# ---------------------------------------------------------------------------------------------------
# Per-code summaries: (count, mean) pairs and the associative operation that merges them (Remark 3.9)
# ---------------------------------------------------------------------------------------------------


def _merge(count_a, mean_a, count_b, mean_b):
    """Merge two per-code summaries; the mean is a convex combination, so it stays bounded.

    Counts are whole numbers, so a non-zero total is >= 1 and clamping at 1 only guards 0 / 0.
    ``mean_a (c_a / c) + mean_b (c_b / c) = mean_a + (mean_b - mean_a) (c_b / c)``: one fused ``lerp`` pass
    over the ``[S, Dv]`` means instead of four (the scan is bound by memory traffic, not arithmetic).
    """
    count = count_a + count_b
    total = count.clamp(min=1.0).to(mean_a.dtype)  # ratios in the means' precision (float64 stays exact)
    return count, torch.lerp(mean_a, mean_b.to(mean_a.dtype), (count_b.to(mean_a.dtype) / total).unsqueeze(-1))


def _summarize(z: torch.Tensor, v: torch.Tensor, n_code: int, acc_dtype: torch.dtype):
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


def _scan_serial(init_count, init_mean, counts, means):
    """Prefix merges over blocks (axis 2), one block at a time; one stack of the prefixes (with the initial one)."""
    prefix_counts, prefix_means = [init_count], [init_mean]
    # unbind, not indexing: the backward of N index ops would build N full-size zero gradients.
    for block_count, block_mean in zip(counts.unbind(2), means.unbind(2)):
        count, mean = _merge(prefix_counts[-1], prefix_means[-1], block_count, block_mean)
        prefix_counts.append(count)
        prefix_means.append(mean)
    return torch.stack(prefix_counts, dim=2), torch.stack(prefix_means, dim=2)


def _scan_matmul(init_count, init_mean, counts, means):
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


def _scan_assoc(init_count, init_mean, counts, means):
    """Inclusive prefix merge by an associative (Hillis-Steele) scan: log2(N) rounds of merges."""
    first_count, first_mean = _merge(init_count, init_mean, counts[:, :, 0], means[:, :, 0])
    count = torch.cat([first_count.unsqueeze(2), counts[:, :, 1:]], dim=2)
    mean = torch.cat([first_mean.unsqueeze(2), means[:, :, 1:]], dim=2)
    N = counts.shape[2]
    step = 1
    while step < N:
        merged_count, merged_mean = _merge(count[:, :, :-step], mean[:, :, :-step], count[:, :, step:], mean[:, :, step:])
        count = torch.cat([count[:, :, :step], merged_count], dim=2)
        mean = torch.cat([mean[:, :, :step], merged_mean], dim=2)
        step *= 2
    return _with_init(init_count, init_mean, count, mean)


def _with_init(init_count, init_mean, counts, means):
    """Prefixes ``[init, through block 0, ..., through block N-1]`` from the inclusive ones (axis 2)."""
    return (torch.cat([init_count.unsqueeze(2), counts], dim=2), torch.cat([init_mean.unsqueeze(2), means], dim=2))


# Each scan returns the N + 1 prefixes (B, G, N + 1, S) and (B, G, N + 1, S, Dv): index 0 is the initial
# summary, index n + 1 the merge through block n.
_SCANS = {"serial": _scan_serial, "matmul": _scan_matmul, "assoc": _scan_assoc}


# ---------------------------------------------------------------------------------------------------
# The softmax over the three score sets
# ---------------------------------------------------------------------------------------------------


def _log_counts(count: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``log c`` (in at least float32) with ``-inf`` for unused codes, which then get exactly zero weight."""
    count = count.to(torch.promote_types(dtype, torch.float32))
    return torch.where(count > 0, count.clamp(min=1.0).log(), torch.full_like(count, float("-inf")))


def _softmax_combine(parts, *, in_place: bool = False):
    """``sum_i exp(s_i - m) @ v_i / sum_i exp(s_i - m).sum(-1)`` with one shared max ``m``.

    Args:
        parts: ``(scores [..., t, m_i], values [..., m_i, Dv])`` pairs; scores may hold ``-inf``, but
            every row has at least one finite score overall (the query's own key).
        in_place: overwrite the scores with the weights (only without autograd). Every fresh tensor of
            ``t x m_i`` floats costs a pass of page faults, which on a CPU bounds the speed more than the matmuls.
    """
    # The softmax runs in float32 (float64 stays float64) whatever the autocast dtype of the scores.
    scores = [s.to(torch.promote_types(s.dtype, torch.float32)) for s, _ in parts]
    # The max is a constant shift: stopping its gradient leaves every gradient of the softmax unchanged.
    shift = torch.stack([s.amax(dim=-1) for s in scores]).amax(dim=0).detach().unsqueeze(-1)
    numerator = denominator = None
    for s, (_, values) in zip(scores, parts):
        weights = s.sub_(shift).exp_() if in_place else torch.exp(s - shift)
        part = weights.to(values.dtype) @ values
        total = weights.sum(dim=-1, keepdim=True)
        if numerator is None:
            numerator, denominator = part, total
        else:
            numerator = numerator.add_(part) if in_place else numerator + part
            denominator = denominator + total
    denominator = denominator.to(numerator.dtype)
    return numerator.div_(denominator) if in_place else numerator / denominator


# ---------------------------------------------------------------------------------------------------
# The two kernels
# ---------------------------------------------------------------------------------------------------


def _attend_within_block(q, k_hat, z, v, codebook, bias, L, state: VQAttentionState, reduction):
    """Queries at positions ``[offset, offset + t)``, all inside block ``n = offset // L``.

    Cost O(t (S + 2L)(Dk + Dv)): this is the decoding path when ``t = 1``.
    """
    B, H, t, Dk = q.shape
    G, S, _ = codebook.shape
    R = H // G
    offset = state.offset
    window_start = (offset // L - 1) * L
    keys = torch.cat([state.recent_k, k_hat.to(state.recent_k.dtype)], dim=2)  # (B, G, W, Dk)
    values = torch.cat([state.recent_v, v.to(state.recent_v.dtype)], dim=2)  # (B, G, W, Dv)
    codes = torch.cat([state.recent_z, z], dim=2)  # (B, G, W)
    W = keys.shape[2]
    first = offset - state.recent_k.shape[2]  # absolute position of keys[:, :, 0]

    qg = q.view(B, G, R, t, Dk)
    window_bias = bias[..., first - window_start: first - window_start + W].reshape(B, G, R, t, W)
    s_window = qg @ keys.unsqueeze(2).transpose(-1, -2) + window_bias  # (B, G, R, t, W)
    key_pos = torch.arange(first, first + W, device=q.device)
    query_pos = torch.arange(offset, offset + t, device=q.device)
    s_window = s_window.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
    s_cache = qg @ codebook.unsqueeze(0).unsqueeze(2).transpose(-1, -2)  # (B, G, R, t, S)
    s_cache = s_cache + _log_counts(state.cache_count, s_cache.dtype)[:, :, None, None, :]

    out = _softmax_combine([(s_cache, state.cache_mean.unsqueeze(2)), (s_window, values.unsqueeze(2))])
    out = out.reshape(B, H, t, -1).to(q.dtype)

    cache_count, cache_mean = state.cache_count, state.cache_mean
    if (offset + t) % L == 0 and W > L:
        # Block n is complete: block n-1 leaves the window and joins the per-code cache.
        count, mean = _summarize(codes[:, :, :L], values[:, :, :L], S, cache_mean.dtype)
        cache_count, cache_mean = _merge(cache_count, cache_mean, count, mean)
        keys, values, codes = keys[:, :, L:], values[:, :, L:], codes[:, :, L:]
    return out, VQAttentionState(offset + t, cache_count, cache_mean, keys, values, codes)


def _attend_blocks(q, k_hat, z, v, codebook, bias, L, state: VQAttentionState, reduction):
    """Queries of ``N`` whole blocks starting at a block boundary ``offset = n L``, all in parallel.

    The two-block window of query block ``n`` is the contiguous run of keys ``[(n-1) L, (n+1) L)`` of the keys
    prefixed by block ``n-1 = -1`` (from the state, or zeros). So the window scores are one matmul against an
    overlapping (unfolded) view of those keys, laid out column for column like ``bias``, and the window values are
    read through the same kind of view: no key or value is copied per block.
    """
    B, H, T, Dk = q.shape
    G, S, _ = codebook.shape
    R, N, Dv = H // G, T // L, v.shape[-1]
    acc_dtype = state.cache_mean.dtype

    # Block n-1 of query block 0 comes from the state (absent at the start of a sequence: zeros, masked).
    has_prev_block = state.recent_k.shape[2] == L
    if has_prev_block:
        first_k, first_v, first_z = state.recent_k, state.recent_v, state.recent_z
    else:
        first_k = state.recent_k.new_zeros(B, G, L, Dk)
        first_v = state.recent_v.new_zeros(B, G, L, Dv)
        first_z = z.new_zeros(B, G, L)
    k_all = torch.cat([first_k, k_hat.to(first_k.dtype)], dim=2)  # (B, G, (N + 1) L, Dk): blocks -1 .. N-1
    v_all = torch.cat([first_v, v.to(first_v.dtype)], dim=2)  # (B, G, (N + 1) L, Dv)
    v_prev = v_all[:, :, :T].view(B, G, N, L, Dv)  # block n-1 of each query block n
    z_prev = torch.cat([first_z, z[:, :, :T - L]], dim=2).view(B, G, N, L)

    q_blocks = q.view(B, G, R, N, L, Dk).transpose(2, 3)  # (B, G, N, R, L, Dk)
    bias_blocks = bias.view(B, G, R, N, L, 2 * L).transpose(2, 3)  # (B, G, N, R, L, 2L)
    k_window = k_all.unfold(2, 2 * L, L)  # (B, G, N, Dk, 2L): column j is the key at (n-1) L + j
    # Without autograd the score and weight tensors are scratch space: update them in place. Every fresh tensor of
    # T x (S + 2L) floats costs a pass of page faults, and these passes, not the matmuls, bound the speed on a CPU.
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_hat, v, bias))
    add, masked_fill = (torch.add, torch.Tensor.masked_fill) if grad else (torch.Tensor.add_, torch.Tensor.masked_fill_)

    s_window = add(q_blocks @ k_window.unsqueeze(3), bias_blocks)  # (B, G, N, R, L, 2L)
    column = torch.arange(2 * L, device=q.device)
    row = torch.arange(L, device=q.device)
    blocked = (column[None, :] > L + row[:, None]).expand(N, L, 2 * L)  # (N, L, 2L): future keys
    if not has_prev_block:
        blocked = blocked.clone()
        blocked[0, :, :L] = True  # block -1 does not exist
    s_window = masked_fill(s_window, blocked[:, None], float("-inf"))

    # Cache of query block i: the state's cache merged with blocks n-1 .. n+i-2, i.e. the prefix before the
    # "previous" block i; the last prefix (through every block) is the final state's cache.
    counts, means = _summarize(z_prev, v_prev, S, acc_dtype)  # (B, G, N, S), (B, G, N, S, Dv)
    if not has_prev_block:
        counts = torch.cat([torch.zeros_like(counts[:, :, :1]), counts[:, :, 1:]], dim=2)
    prefix_count, prefix_mean = _SCANS[reduction](state.cache_count, state.cache_mean, counts, means)
    cache_count, cache_mean = prefix_count[:, :, :-1], prefix_mean[:, :, :-1]  # (B, G, N, S), (B, G, N, S, Dv)

    # One (R T, Dk) x (Dk, S) product per group: the codebook is shared by every block.
    s_cache = (q.reshape(B, G, R * T, Dk) @ codebook.transpose(-1, -2).unsqueeze(0)).view(B, G, R, N, L, S)
    s_cache = add(s_cache.transpose(2, 3), _log_counts(cache_count, s_cache.dtype)[:, :, :, None, None, :])

    # The softmax over [cache | previous block | present block] with one shared max (float32 at least).
    v_window = v_all.unfold(2, 2 * L, L).transpose(-1, -2)  # (B, G, N, 2L, Dv): overlapping view, no copy
    out = _softmax_combine([(s_cache, cache_mean.unsqueeze(3)), (s_window, v_window.unsqueeze(3))],
                           in_place=not grad)  # (B, G, N, R, L, Dv)
    out = out.transpose(2, 3).reshape(B, H, T, Dv).to(q.dtype)

    new_state = VQAttentionState(
        offset=state.offset + T,
        cache_count=prefix_count[:, :, -1],
        cache_mean=prefix_mean[:, :, -1],
        recent_k=k_all[:, :, -L:],
        recent_v=v_all[:, :, -L:],
        recent_z=z[:, :, -L:],
    )
    return out, new_state
