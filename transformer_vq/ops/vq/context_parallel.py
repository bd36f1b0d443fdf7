"""Context parallelism for VQ attention: one sequence split along time over ranks, no all-gather of keys.

The state a call of :func:`~transformer_vq.ops.vq.vq_attention` hands the next (:class:`VQAttentionState`) is all a
chunk needs of everything before it. At a block boundary it is small and composes associatively:

* the per-code cache ``(count, mean)`` of every key older than the last block (merged by
  :func:`~transformer_vq.ops.vq.cache.merge`, an exact convex combination: no running max or other non-additive
  part, since the softmax's shared max is taken per query, never stored);
* the last block's keys, values and codes, kept verbatim.

So a chunk of whole blocks has a *summary* independent of what came before it (:func:`chunk_summary`: the cache of
its keys but the last block, and that block), and the state after it is :func:`compose` of the state before it with
its summary. Context parallelism is then three steps per rank ``r`` of ``R``:

1. summarize the local chunk (one scatter of codes: no attention is needed for it);
2. exchange the summaries (one all-gather of ``S (Dv + 1) + L (Dk + Dv + 1) + 1`` numbers per batch row and group,
   whatever the chunk length) and compose an exclusive prefix: the state entering chunk ``r``;
3. run the ordinary operator on the chunk from that state.

The backward of step 2 is the reverse scan: the gradient reaching the summary of chunk ``j`` is the sum, over the
ranks ``r > j`` whose incoming state holds it, of what their losses send back through the prefix. Autograd computes
each rank's share through the local composition, and :class:`_GatherSummaries` sums the shares over ranks.

:func:`vq_attention_context_parallel_reference` simulates ``R`` ranks in one process (the oracle of the tests);
:func:`vq_attention_context_parallel` is the ``torch.distributed`` version.

Letters: B batch, H query heads, G key/value groups, T tokens of a chunk, L block length, S codewords, Dk key width,
Dv value width, R ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from transformer_vq.ops.vq.attention import vq_attention
from transformer_vq.ops.vq.cache import merge, summarize
from transformer_vq.ops.vq.state import VQAttentionState


@dataclass
class ChunkSummary:
    """What a chunk of whole blocks contributes to the state of every later position."""

    length: int
    """Tokens in the chunk (a positive multiple of ``L``)."""
    count: torch.Tensor
    """``[B, G, S]`` float32: keys per code among all but the chunk's last block."""
    mean: torch.Tensor
    """``[B, G, S, Dv]``: the mean of their values (0 where the count is 0)."""
    last_k: torch.Tensor
    """``[B, G, L, Dk]``: the keys of the chunk's last block."""
    last_v: torch.Tensor
    """``[B, G, L, Dv]``: their values."""
    last_z: torch.Tensor
    """``[B, G, L]`` int64: their codes."""


def chunk_summary(k_hat: torch.Tensor, v: torch.Tensor, z: torch.Tensor, *, block_len: int, n_code: int,
                  acc_dtype: torch.dtype) -> ChunkSummary:
    """The summary of one chunk: the state the operator would end with had it started the chunk from nothing.

    Shapes: ``k_hat [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``z [B, G, T]`` with ``T`` a positive multiple of ``L``;
    ``acc_dtype`` the dtype of the cache's means (that of :meth:`VQAttentionState.empty`).
    """
    T, L = k_hat.shape[2], block_len
    check_chunk_length(T, L)
    count, mean = summarize(z[:, :, :T - L], v[:, :, :T - L], n_code, acc_dtype)
    return ChunkSummary(T, count, mean, k_hat[:, :, T - L:], v[:, :, T - L:], z[:, :, T - L:])


def compose(state: VQAttentionState, summary: ChunkSummary, block_len: int) -> VQAttentionState:
    """The state after ``state``'s tokens and then the chunk of ``summary``.

    ``state`` must end at a block boundary, so it keeps either nothing (offset 0) or exactly the block before it
    verbatim: that block leaves the window once the chunk is consumed and joins the cache, then the chunk's own cache.
    """
    L = block_len
    if state.offset % L != 0:
        raise ValueError(f"context parallelism composes states at block boundaries: the incoming state's offset "
                         f"{state.offset} is not a multiple of block_len={L}")
    count, mean = state.cache_count, state.cache_mean
    if state.recent_k.shape[2] == L:
        block_count, block_mean = summarize(state.recent_z, state.recent_v, count.shape[-1], mean.dtype)
        count, mean = merge(count, mean, block_count, block_mean)
    count, mean = merge(count, mean, summary.count, summary.mean)
    return VQAttentionState(state.offset + summary.length, count, mean,
                            summary.last_k.to(state.recent_k.dtype), summary.last_v.to(state.recent_v.dtype),
                            summary.last_z, state.recent_start.new_zeros(summary.last_z.shape[0], L), L)


def prefix_states(state: VQAttentionState, summaries: list[ChunkSummary], block_len: int) -> list[VQAttentionState]:
    """The ``R + 1`` states ``[state, after chunk 0, ..., after chunk R-1]``: index ``r`` enters chunk ``r``."""
    states = [state]
    for summary in summaries:
        states.append(compose(states[-1], summary, block_len))
    return states


def check_chunk_length(length: int, block_len: int) -> None:
    """Raise ``ValueError`` unless a chunk of ``length`` tokens is a positive number of whole blocks."""
    if length < block_len or length % block_len != 0:
        raise ValueError(f"context parallelism splits sequences into chunks of whole blocks: a chunk of {length} "
                         f"tokens is not a positive multiple of block_len={block_len}; make each rank's share of "
                         f"the sequence a multiple of {block_len}")


def vq_attention_context_parallel_reference(
    q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int, ranks: int,
    z: torch.Tensor, codebook: torch.Tensor, state: VQAttentionState | None = None, **options,
) -> tuple[torch.Tensor, VQAttentionState]:
    """``R = ranks`` simulated in one process: each chunk attends from the state composed of the summaries of the
    chunks before it. Same arguments and results as :func:`~transformer_vq.ops.vq.vq_attention` (``options``: its
    ``reduction`` and ``backend``); ``T`` must split into ``R`` chunks of whole blocks."""
    T = q.shape[2]
    if T % ranks != 0:
        raise ValueError(f"{T} tokens do not split into {ranks} equal chunks")
    state = _start(state, q, v, codebook)
    pieces = [torch.tensor_split(t, ranks, dim=2) for t in (q, k_hat, v, bias, z)]
    summaries = [chunk_summary(k, vv, zz, block_len=block_len, n_code=codebook.shape[1],
                               acc_dtype=state.cache_mean.dtype) for k, vv, zz in zip(pieces[1], pieces[2], pieces[4])]
    states = prefix_states(state, summaries, block_len)
    outs = [vq_attention(qq, k, vv, b, block_len=block_len, state=s, z=zz, codebook=codebook, **options)[0]
            for qq, k, vv, b, zz, s in zip(*pieces, states)]
    return torch.cat(outs, dim=2), states[-1]


def vq_attention_context_parallel(
    q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int,
    group: dist.ProcessGroup | None, z: torch.Tensor, codebook: torch.Tensor, state: VQAttentionState | None = None,
    **options,
) -> tuple[torch.Tensor, VQAttentionState]:
    """This rank's chunk of a sequence split along time over the ranks of ``group``, forward and backward.

    Rank ``r`` passes its chunk (tokens ``[sum of the lengths of ranks < r, ...)``, a positive multiple of ``L``;
    the chunks may differ in length) and the state at the start of the *whole* sequence (the same on every rank:
    ``None``, or what the previous call returned). Returns this chunk's ``out [B, H, T, Dv]`` and the state after
    the whole sequence (the same on every rank, to continue with the next window). Gradients reach earlier ranks'
    values and keys through the exchanged summaries; a gradient of ``state`` on each rank is that rank's share
    (sum it over the group). ``options``: ``reduction`` and ``backend`` of :func:`vq_attention`.

    Every rank of the group must call this the same number of times, in the same order, and use ``out`` in its
    loss: the backward holds one collective, which each rank joins through ``out``.
    """
    if not options.get("compressive_cache", True):
        raise ValueError("context parallelism hands each rank the per-code cache of the ranks before it; "
                         "compressive_cache=False is not supported with it")
    state = _start(state, q, v, codebook)
    local = chunk_summary(k_hat, v, z, block_len=block_len, n_code=codebook.shape[1],
                          acc_dtype=state.cache_mean.dtype)
    flat, layout = pack(local)
    gathered = _GatherSummaries.apply(flat, group)  # (R, numbers)
    summaries = [unpack(row, layout, local) for row in gathered.unbind(0)]
    states = prefix_states(state, summaries, block_len)
    rank = dist.get_rank(group)
    out, _ = vq_attention(q, k_hat, v, bias, block_len=block_len, state=states[rank], z=z, codebook=codebook,
                          **options)
    # Rank 0's incoming state holds no summary, so without this its backward would never reach the gather, and the
    # collective there would wait forever for it. The tie adds nothing to any gradient.
    return _Tie.apply(out, gathered), states[-1]


def _start(state, q, v, codebook) -> VQAttentionState:
    """``state``, or the empty state of the start of a sequence."""
    if state is not None:
        return state
    B, G, (S, Dk) = q.shape[0], v.shape[1], codebook.shape[1:]
    return VQAttentionState.empty(B, G, S, Dk, v.shape[-1], dtype=v.dtype, device=v.device)


def pack(summary: ChunkSummary) -> tuple[torch.Tensor, list[tuple[str, torch.Size]]]:
    """One flat tensor (the means' dtype) of the summary: one collective instead of six.

    The codes and counts are whole numbers below ``2^24``, exact in float32 and float64; the length rides along so
    that chunks may differ in length.
    """
    dtype = summary.mean.dtype
    parts = [("count", summary.count), ("mean", summary.mean), ("last_k", summary.last_k),
             ("last_v", summary.last_v), ("last_z", summary.last_z)]
    flat = torch.cat([torch.tensor([float(summary.length)], dtype=dtype, device=summary.mean.device)]
                     + [t.to(dtype).reshape(-1) for _, t in parts])
    return flat, [(name, t.shape) for name, t in parts]


def unpack(flat: torch.Tensor, layout: list[tuple[str, torch.Size]], like: ChunkSummary) -> ChunkSummary:
    """The summary that :func:`pack` flattened, in the dtypes of ``like``; counts and codes carry no gradient."""
    fields, start = {}, 1
    for name, shape in layout:
        size = shape.numel()
        fields[name] = flat[start:start + size].view(shape)
        start += size
    return ChunkSummary(
        length=int(flat[0].item()),
        count=fields["count"].detach().to(like.count.dtype),
        mean=fields["mean"],
        last_k=fields["last_k"].to(like.last_k.dtype),
        last_v=fields["last_v"].to(like.last_v.dtype),
        last_z=fields["last_z"].detach().to(like.last_z.dtype),
    )


class _GatherSummaries(torch.autograd.Function):
    """All-gather of the packed summaries; backward: each rank gets the sum over ranks of the gradients of its row.

    One collective each way, whatever the number of tensors: separate collectives per tensor could be reached in a
    different order on different ranks during the backward (autograd orders independent nodes freely).
    """

    @staticmethod
    def forward(ctx, flat: torch.Tensor, group):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        rows = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, flat.contiguous(), group=group)
        return torch.stack(rows)  # (R, numbers)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()  # the all-reduce writes in place; autograd may share the incoming buffer
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.rank], None


class _Tie(torch.autograd.Function):
    """``out`` unchanged; in the backward a zero gradient for ``anchor``, so that ``anchor``'s graph is always walked."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, anchor: torch.Tensor):
        ctx.anchor_shape, ctx.anchor_dtype = anchor.shape, anchor.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_zeros(ctx.anchor_shape, dtype=ctx.anchor_dtype)
