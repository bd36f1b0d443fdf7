"""The two kernels of the VQ operator and the softmax they share (Theorem 3.7).

A query in block n attends the keys of blocks n-1 and n directly (window bias, causal mask) and every older key through
the per-code cache of :mod:`transformer_vq.ops.vq.cache`; :func:`softmax_combine` normalizes the score sets together.

Packed documents (``doc_start``, :mod:`transformer_vq.ops.documents`): a query attends only keys of its own document.
In the window that is a mask on equal segment ids. The cache of a query block summarizes the keys before its window
that belong to the document of the last of them (the per-block summaries keep the keys after a block's last start,
and the prefix over blocks restarts at every block holding a start: a segmented scan); a query sees it only when no
document begins between the window's first key and itself.

* :func:`attend_within_block`: queries that all lie in one block (the head of a call that starts mid-block, a short
  tail, single-token decoding);
* :func:`attend_blocks`: whole blocks in parallel, the cache of each block being a prefix over the blocks before it.

Letters: B batch, H query heads, G key/value groups, R = H // G heads per group, t or T queries, N blocks, L block
length, S codewords, W window keys, Dk key width, Dv value width.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.vq.cache import PREFIXES, log_counts, merge, restart, summarize
from transformer_vq.ops.vq.state import VQAttentionState


def softmax_combine(parts, *, in_place: bool = False):
    """``sum_i exp(s_i - m) @ v_i / sum_i exp(s_i - m).sum(-1)`` with one shared max ``m``.

    Args:
        parts: ``(scores [..., t, m_i], values [..., m_i, Dv])`` pairs; scores may hold ``-inf``, but
            every row has at least one finite score overall (the query's own key).
        in_place: overwrite the scores with the weights (only without autograd). Every fresh tensor of
            ``t x m_i`` floats costs a pass of page faults, which on a CPU bounds the speed more than the matmuls.
    """
    # The softmax runs in float32 (float64 stays float64) whatever the autocast dtype of the scores.
    scores = [s.to(torch.promote_types(s.dtype, torch.float32)) for s, _ in parts]
    # The max is a constant shift: stopping its gradient leaves every gradient of the softmax unchanged. Taken of the
    # detached scores, autograd records no max at all (a recorded one would keep every score for its backward).
    shift = torch.stack([s.detach().amax(dim=-1) for s in scores]).amax(dim=0).unsqueeze(-1)
    numerator = denominator = None
    for s, (_, values) in zip(scores, parts):
        weights = s.sub_(shift).exp_() if in_place else torch.exp(s - shift)
        total = weights.sum(dim=-1, keepdim=True)
        if numerator is None:
            numerator, denominator = weights.to(values.dtype) @ values, total
        else:
            numerator = add_product(numerator, weights, values)
            denominator = denominator + total
    denominator = denominator.to(numerator.dtype)
    return numerator.div_(denominator) if in_place else Normalize.apply(numerator, denominator)


def add_product(total: torch.Tensor, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``total + weights @ values``, accumulated into ``total`` by one batched ``baddbmm_``: no ``[..., t, Dv]``
    product is made beside it. ``total [..., t, Dv]`` is a fresh product (autograd or not, in place is safe: a
    product's backward needs its inputs, never its output); ``values [..., m, Dv]`` broadcasts over the batch
    dimensions of ``weights [..., t, m]`` as in ``@``. Where the product's dtype is not ``total``'s (mixed parts under
    autocast) it is made and added."""
    if values.dtype != total.dtype:
        return total.add_(weights.to(values.dtype) @ values)
    batch, (t, m), Dv = weights.shape[:-2], weights.shape[-2:], values.shape[-1]
    values = values.expand(*batch, m, Dv).reshape(-1, m, Dv)  # a view where nothing is broadcast (one head a group)
    total.view(-1, t, Dv).baddbmm_(weights.to(total.dtype).reshape(-1, t, m), values)
    return total


class Normalize(torch.autograd.Function):
    """``numerator / denominator`` (rows ``[..., t, Dv]`` by ``[..., t, 1]``) keeping the quotient for the backward
    instead of the numerator: the quotient is kept anyway (the unit's gating saves it), the numerator then is not.

    ``d numerator = g / denominator``, ``d denominator = -sum(g * out) / denominator`` (``out = numerator /
    denominator``).
    """

    @staticmethod
    def forward(ctx, numerator, denominator):
        out = numerator / denominator
        ctx.save_for_backward(out, denominator)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, denominator = ctx.saved_tensors
        return grad / denominator, -(grad * out).sum(dim=-1, keepdim=True) / denominator


def codebook_scores(q, codebook, code_scores=None):
    """``(B, G, R, t, S)`` score of each query against each codeword of its group: ``q @ codebook^T``.

    ``code_scores [B, H, t, S]``, when given, are those scores computed by the caller (with quantized queries they
    are rows of a table of code-pair scores, docs/operator.md): they are used as they are and never written to.
    """
    B, H, t, Dk = q.shape
    G, S, _ = codebook.shape
    R = H // G
    if code_scores is not None:
        return code_scores.reshape(B, G, R, t, S)
    # One (R t, Dk) x (Dk, S) product per group: the codebook is shared by every head of the group and every query.
    return (q.reshape(B, G, R * t, Dk) @ codebook.transpose(-1, -2).unsqueeze(0)).view(B, G, R, t, S)


def cache_logits(count, cache_bias, dtype):
    """``log c[s] + b_h``: what a cache entry adds to its codeword score ``q . C_s``, laid out to broadcast over
    the scores ``(B, G, [N,] R, t, S)`` of the kernels (``-inf`` for unused codes, whatever the bias).

    ``count`` is ``(B, G, [N,] S)``; ``cache_bias`` ``[H]`` (``None``: 0, the paper's operator), the logit of head
    ``h = g R + r`` for every key older than the two-block window, which the dense formula adds to each such key's
    score; every key a code summarizes gets it, so the code's entry does too. Returns ``(B, G, [N,] 1 or R, 1, S)``
    in at least float32.
    """
    logits = log_counts(count, dtype)[..., None, None, :]  # (B, G, [N,] 1, 1, S)
    if cache_bias is None:
        return logits
    G = count.shape[1]
    per_group = cache_bias.to(logits.dtype).view(G, *[1] * (count.dim() - 3), -1, 1, 1)  # (G, [1,] R, 1, 1)
    return logits + per_group


def attend_within_block(q, k_hat, z, v, codebook, bias, L, state: VQAttentionState, reduction, code_scores=None,
                        compressive_cache=True, doc_start=None, cache_bias=None):
    """Queries at positions ``[offset, offset + t)``, all inside block ``n = offset // L``.

    Cost O(t (S + 2L)(Dk + Dv)): this is the decoding path when ``t = 1``. ``reduction`` is unused (one block).
    ``code_scores``: see :func:`codebook_scores`. ``compressive_cache`` false: the window alone (the cache is
    neither read nor updated). ``doc_start``: ``[B, t]`` bool, True where a document begins (``None``: nowhere).
    ``cache_bias``: ``[H]`` or ``None``, see :func:`cache_logits`.
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
    starts = torch.cat([state.recent_start, _no_starts(z) if doc_start is None else doc_start], dim=1)  # (B, W)
    # Segment 0 is the document of the key before the window, the one the cache summarizes.
    segment = starts.to(torch.long).cumsum(dim=1) if doc_start is not None else None  # (B, W)
    if segment is not None:
        other_doc = segment[:, None, :] != segment[:, W - t:, None]  # (B, t, W)
        s_window = s_window.masked_fill(other_doc[:, None, None], float("-inf"))
    parts = [(s_window, values.unsqueeze(2))]
    if compressive_cache:
        s_cache = codebook_scores(q, codebook, code_scores)  # (B, G, R, t, S)
        s_cache = s_cache + cache_logits(state.cache_count, cache_bias, s_cache.dtype)  # (B, G, R, t, S)
        if segment is not None:
            s_cache = s_cache.masked_fill((segment[:, W - t:] != 0)[:, None, None, :, None], float("-inf"))
        parts.insert(0, (s_cache, state.cache_mean.unsqueeze(2)))
    out = softmax_combine(parts).reshape(B, H, t, -1).to(q.dtype)

    cache_count, cache_mean = state.cache_count, state.cache_mean
    if (offset + t) % L == 0 and W > L:
        # Block n is complete: block n-1 leaves the window and joins the per-code cache (when there is one).
        if compressive_cache:
            weight = None
            if segment is not None:
                weight = (segment[:, :L] == segment[:, L - 1:L])[:, None]  # (B, 1, L): after the block's last start
                cache_count, cache_mean = restart(cache_count, cache_mean, ~starts[:, :L].any(dim=1))
            count, mean = summarize(codes[:, :, :L], values[:, :, :L], S, cache_mean.dtype, weight)
            cache_count, cache_mean = merge(cache_count, cache_mean, count, mean)
        # copies: slices would keep the whole window buffer alive beside the state (and out of its nbytes())
        keys, values, codes, starts = keys[:, :, L:].clone(), values[:, :, L:].clone(), codes[:, :, L:].clone(), \
            starts[:, L:].clone()
    return out, VQAttentionState(offset + t, cache_count, cache_mean, keys, values, codes, starts, L,
                                 documents=doc_start is not None)


def attend_blocks(q, k_hat, z, v, codebook, bias, L, state: VQAttentionState, reduction, code_scores=None,
                  compressive_cache=True, doc_start=None, cache_bias=None):
    """Queries of ``N`` whole blocks starting at a block boundary ``offset = n L``, all in parallel.

    The two-block window of query block ``n`` is the contiguous run of keys ``[(n-1) L, (n+1) L)`` of the keys
    prefixed by block ``n-1 = -1`` (from the state, or zeros). So the window scores are one matmul against an
    overlapping (unfolded) view of those keys, laid out column for column like ``bias``, and the window values are
    read through the same kind of view: no key or value is copied per block. ``code_scores``: see
    :func:`codebook_scores`. ``compressive_cache`` false: the window alone (no cache is built or read).
    ``doc_start``: ``[B, T]`` bool, True where a document begins (``None``: nowhere). ``cache_bias``: ``[H]`` or
    ``None``, see :func:`cache_logits`.
    """
    B, H, T, Dk = q.shape
    G, S, _ = codebook.shape
    R, N, Dv = H // G, T // L, v.shape[-1]
    k_all, v_all, z_prev, prev_len = prepend_previous_block(k_hat, z, v, L, state)

    q_blocks = q.view(B, G, R, N, L, Dk).transpose(2, 3)  # (B, G, N, R, L, Dk)
    bias_blocks = bias.view(B, G, R, N, L, 2 * L).transpose(2, 3)  # (B, G, N, R, L, 2L)
    k_window = k_all.unfold(2, 2 * L, L)  # (B, G, N, Dk, 2L): column j is the key at (n-1) L + j
    # Without autograd the score and weight tensors are scratch space: update them in place. Every fresh tensor of
    # T x (S + 2L) floats costs a pass of page faults, and these passes, not the matmuls, bound the speed on a CPU.
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_hat, v, bias))
    add, masked_fill = (torch.add, torch.Tensor.masked_fill) if grad else (torch.Tensor.add_, torch.Tensor.masked_fill_)

    s_window = add(q_blocks @ k_window.unsqueeze(3), bias_blocks)  # (B, G, N, R, L, 2L)
    s_window = masked_fill(s_window, _window_mask(N, L, prev_len, q.device)[:, None], float("-inf"))
    starts = block_starts(z, L, state, doc_start)  # (B, (N + 1) L)
    docs = None if doc_start is None else BlockDocuments(starts, N, L)
    if docs is not None:
        s_window = masked_fill(s_window, docs.window_mask[:, None, :, None], float("-inf"))

    # The softmax over [cache | previous block | present block] with one shared max (float32 at least).
    v_window = v_all.unfold(2, 2 * L, L).transpose(-1, -2)  # (B, G, N, 2L, Dv): overlapping view, no copy
    parts = [(s_window, v_window.unsqueeze(3))]
    final_count, final_mean = state.cache_count, state.cache_mean
    if compressive_cache:
        (s_cache, cache_mean), final_count, final_mean = _cache_part(
            q, z_prev, v_all, codebook, L, state, reduction, code_scores, prev_len, add, docs, cache_bias)
        if docs is not None:
            s_cache = masked_fill(s_cache, docs.cache_mask[:, None, :, None, :, None], float("-inf"))
        parts.insert(0, (s_cache, cache_mean.unsqueeze(3)))
    out = softmax_combine(parts, in_place=not grad)  # (B, G, N, R, L, Dv)
    out = out.transpose(2, 3).reshape(B, H, T, Dv).to(q.dtype)
    # Copies, not slices: a slice of k_all keeps the whole call's keys alive beside the state (after a long prefill,
    # every layer's; nbytes() counts the slice), and a view of the caller's ``z`` would change with it (a loop that
    # refills one code buffer per call would rewrite the state's codes).
    return out, VQAttentionState(state.offset + T, final_count, final_mean, k_all[:, :, -L:].clone(),
                                 v_all[:, :, -L:].clone(), z[:, :, -L:].clone(), starts[:, -L:].clone(), L,
                                 documents=doc_start is not None)


def block_starts(z, L, state: VQAttentionState, doc_start) -> torch.Tensor:
    """``(B, (N + 1) L)`` bool: the document starts of blocks ``-1 .. N-1``, laid out as the keys
    :func:`prepend_previous_block` returns (the missing keys of block ``-1`` begin none)."""
    prev_len = state.recent_start.shape[1]
    return torch.cat([_no_starts(z[:, :, :L - prev_len]), state.recent_start,
                      _no_starts(z) if doc_start is None else doc_start], dim=1)


class BlockDocuments:
    """Where packed documents fall in ``N`` whole query blocks, from the starts ``(B, (N + 1) L)`` of blocks
    ``-1 .. N-1`` (the keys :func:`prepend_previous_block` returns).

    * ``window_mask (B, N, L, 2L)``: window column ``j`` of query row ``i`` is in another document;
    * ``cache_mask (B, N, L)``: the cache of the query block (the keys before its window) is another document's:
      one begins between the window's first key and the query;
    * ``weight (B, N, L)`` and ``keep (B, N)``: per block ``-1 .. N-2``, the keys after its last start (those the
      cache of later blocks may hold) and whether no document begins in it (else the prefix restarts there);
    * ``segment (B, (N + 1) L)`` and ``cache_segment (B, N)``: the ids both masks compare (the document of each key,
      and the one the cache of each query block summarizes), which the fused kernels read instead of the masks.
    """

    def __init__(self, starts: torch.Tensor, N: int, L: int):
        B = starts.shape[0]
        segment = starts.to(torch.long).cumsum(dim=1)  # (B, (N + 1) L)
        query_segment = segment[:, L:].view(B, N, L)
        self.window_mask = segment.unfold(1, 2 * L, L)[:, :, None, :] != query_segment[..., None]
        before_window = (segment - starts.to(torch.long))[:, :N * L:L]  # (B, N): segment of the key before window i
        self.cache_mask = query_segment != before_window[..., None]
        self.segment, self.cache_segment = segment, before_window
        prev_segment = segment[:, :N * L].view(B, N, L)
        self.weight = prev_segment == prev_segment[..., -1:]
        self.keep = ~starts[:, :N * L].view(B, N, L).any(dim=-1)


def _no_starts(z: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` False: no document begins at the positions of ``z (B, G, T)``."""
    return torch.zeros(z.shape[0], z.shape[2], dtype=torch.bool, device=z.device)


def _cache_part(q, z_prev, v_all, codebook, L, state: VQAttentionState, reduction, code_scores, prev_len, add,
                docs: BlockDocuments | None = None, cache_bias=None):
    """``(s_cache (B, G, N, R, L, S), cache_mean (B, G, N, S, Dv))`` of each query block, and the cache after the
    last block (count and mean) for the state.

    The cache of query block i is the state's cache merged with blocks n-1 .. n+i-2, i.e. the prefix before the
    "previous" block i; the last prefix (through every block) is the final state's cache.
    """
    B, H, T, _ = q.shape
    G, S, _ = codebook.shape
    R, N = H // G, T // L
    prefix_count, prefix_mean = block_prefixes(z_prev, v_all, S, L, state, reduction, prev_len, docs)
    cache_count, cache_mean = prefix_count[:, :, :-1], prefix_mean[:, :, :-1]  # (B, G, N, S), (B, G, N, S, Dv)

    s_cache = codebook_scores(q, codebook, code_scores).view(B, G, R, N, L, S)
    # The caller's scores are read, not overwritten: the first step then makes the fresh tensor the rest may update.
    add_counts = add if code_scores is None else torch.add
    s_cache = add_counts(s_cache.transpose(2, 3), cache_logits(cache_count, cache_bias, s_cache.dtype))
    # the final cache copied out of the prefixes of every block, which would otherwise stay alive beside the state
    return (s_cache, cache_mean), prefix_count[:, :, -1].clone(), prefix_mean[:, :, -1].clone()


def block_prefixes(z_prev, v_all, S, L, state: VQAttentionState, reduction, prev_len,
                   docs: BlockDocuments | None = None):
    """The caches of ``N`` whole query blocks: the prefixes ``(B, G, N + 1, S)``, ``(B, G, N + 1, S, Dv)`` of the
    reduction over the blocks before them, from the outputs of :func:`prepend_previous_block`.

    Index ``i`` is the state's cache merged with blocks ``n-1 .. n+i-2``, the cache of query block ``i``; the last
    (through every block) is the final state's cache. With ``docs``, a segmented scan (:class:`BlockDocuments`).
    """
    B, G, N, _ = z_prev.shape
    Dv = v_all.shape[-1]
    v_prev = v_all[:, :, :N * L].view(B, G, N, L, Dv)  # block n-1 of each query block n
    weight = None if docs is None else docs.weight[:, None]  # (B, 1, N, L)
    if prev_len < L:  # the zeros standing for the missing keys of block -1 are no keys
        real = torch.ones(N, L, dtype=torch.bool, device=z_prev.device)
        real[0, :L - prev_len] = False
        weight = real if weight is None else weight & real
    counts, means = summarize(z_prev, v_prev, S, state.cache_mean.dtype, weight)  # (B, G, N, S), (B, G, N, S, Dv)
    return PREFIXES[reduction](state.cache_count, state.cache_mean, counts, means,
                               None if docs is None else docs.keep)


def prepend_previous_block(k_hat, z, v, L, state: VQAttentionState):
    """The keys and values of blocks ``-1 .. N-1`` and the codes of the block before each query block.

    Block ``-1`` (the one before the first query block) comes from the state. It holds fewer than ``L`` keys when the
    sequence began after its start (none at the start of a sequence; some when a state began at a position inside
    it); zeros stand for the missing ones, masked out of the scores and left out of the cache.

    Returns:
        ``k_all (B, G, (N + 1) L, Dk)``, ``v_all (B, G, (N + 1) L, Dv)``, ``z_prev (B, G, N, L)`` and the number of
        real keys of block ``-1`` (its last ones).
    """
    B, G, T, Dk = k_hat.shape
    Dv = v.shape[-1]
    prev_len = state.recent_k.shape[2]
    missing = L - prev_len
    first_k = torch.cat([state.recent_k.new_zeros(B, G, missing, Dk), state.recent_k], dim=2)
    first_v = torch.cat([state.recent_v.new_zeros(B, G, missing, Dv), state.recent_v], dim=2)
    first_z = torch.cat([z.new_zeros(B, G, missing), state.recent_z], dim=2)
    k_all = torch.cat([first_k, k_hat.to(first_k.dtype)], dim=2)
    v_all = torch.cat([first_v, v.to(first_v.dtype)], dim=2)
    z_prev = torch.cat([first_z, z[:, :, :T - L]], dim=2).view(B, G, T // L, L)
    return k_all, v_all, z_prev, prev_len


def _window_mask(N: int, L: int, prev_len: int, device) -> torch.Tensor:
    """``(N, L, 2L)`` True where window column ``j`` of query row ``i`` is masked: a future key, or one of the
    missing keys of block ``-1`` (the first ``L - prev_len``)."""
    column = torch.arange(2 * L, device=device)
    row = torch.arange(L, device=device)
    blocked = (column[None, :] > L + row[:, None]).expand(N, L, 2 * L)
    if prev_len < L:
        blocked = blocked.clone()
        blocked[0, :, :L - prev_len] = True
    return blocked
