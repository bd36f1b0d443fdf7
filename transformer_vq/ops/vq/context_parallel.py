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
2. exchange the summaries (one all-gather of ``S (Dv + 1) + L (Dk + Dv + 1)`` numbers per batch row and group,
   whatever the chunk length, and two more: the chunk length and what the rank refused of its input) and compose an
   exclusive prefix: the state entering chunk ``r``;
3. run the ordinary operator on the chunk from that state.

A rank checks its own input (its chunk length, the options, and everything the operator checks of its tensors, state
and backend) before the exchange and sends what it refused with its summary rather than raising alone: the other ranks
would otherwise wait in the all-gather, or in the backward's, until the process group's timeout. After the exchange
every rank raises an error naming the first rank that refused, that rank with its own reason. (A rank whose keys or
values differ in size from the others' (batch, groups, widths, codebook) cannot size its share of the exchange alike.)

The backward of step 2 is the reverse scan: the gradient reaching the summary of chunk ``j`` is the sum, over the
ranks ``r > j`` whose incoming state holds it, of what their losses send back through the prefix. Autograd computes
each rank's share through the local composition, and :class:`_GatherSummaries` sums the shares over ranks.

:func:`vq_attention_context_parallel_reference` simulates ``R`` ranks in one process (the oracle of the tests);
:func:`vq_attention_context_parallel` is the ``torch.distributed`` version.

Letters: B batch, H query heads, G key/value groups, T tokens of a chunk, L block length, S codewords, Dk key width,
Dv value width, R ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from transformer_vq.ops.vq.attention import attend_checked, check_vq_call, kernels, vq_attention
from transformer_vq.ops.vq.cache import merge, restart, summarize
from transformer_vq.ops.vq.state import VQAttentionState, check_vq_state


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

    ``state`` must end at a block boundary, so its window holds the block before it (or the part of that block since
    the sequence began): that block leaves the window once the chunk is consumed and joins the cache, then the chunk's
    own cache.
    """
    L = block_len
    if state.offset % L != 0:
        raise ValueError(f"context parallelism composes states at block boundaries: the incoming state's offset "
                         f"{state.offset} is not a multiple of block_len={L}")
    count, mean = _cache_with_window(state)
    count, mean = merge(count, mean, summary.count, summary.mean)
    # the window copied: a summary's last block is a slice of a chunk's keys or of the gathered summaries, which the
    # state would otherwise keep alive
    return VQAttentionState(state.offset + summary.length, count, mean,
                            summary.last_k.to(state.recent_k.dtype, copy=True),
                            summary.last_v.to(state.recent_v.dtype, copy=True), summary.last_z.clone(),
                            state.recent_start.new_zeros(summary.last_z.shape[0], L), L)


def _cache_with_window(state: VQAttentionState) -> tuple[torch.Tensor, torch.Tensor]:
    """``state``'s cache once the keys of its window have joined it, as the operator merges a block leaving the
    window: a packed document begun in the window (a state of a call with ``doc_start``) restarts the cache, which
    then holds only that document's keys (the chunks hold no document start, so every later query is in it)."""
    count, mean = state.cache_count, state.cache_mean
    starts = state.recent_start  # (B, W)
    if starts.shape[1] == 0:
        return count, mean
    segment = starts.to(torch.long).cumsum(dim=1)
    last_document = (segment == segment[:, -1:])[:, None]  # (B, 1, W): the window's keys after its last start
    window_count, window_mean = summarize(state.recent_z, state.recent_v, count.shape[-1], mean.dtype, last_document)
    count, mean = restart(count, mean, ~starts.any(dim=1))
    return merge(count, mean, window_count, window_mean)


def prefix_states(state: VQAttentionState, summaries: list[ChunkSummary], block_len: int) -> list[VQAttentionState]:
    """The ``R + 1`` states ``[state, after chunk 0, ..., after chunk R-1]``: index ``r`` enters chunk ``r``."""
    states = [state]
    for summary in summaries:
        states.append(compose(states[-1], summary, block_len))
    return states


def check_chunk_length(length: int, block_len: int) -> None:
    """Raise ``ValueError`` unless a chunk of ``length`` tokens is a positive number of whole blocks."""
    problem = chunk_length_problem(length, block_len)
    if problem:
        raise ValueError(problem)


def chunk_length_problem(length: int, block_len: int) -> str | None:
    """Why a chunk of ``length`` tokens cannot be a rank's share (``None``: it is a positive number of whole blocks)."""
    if length < block_len or length % block_len != 0:
        return (f"context parallelism splits sequences into chunks of whole blocks: a chunk of {length} tokens is not "
                f"a positive multiple of block_len={block_len}; make each rank's share of the sequence a multiple of "
                f"{block_len}")
    return None


HONOURED_OPTIONS = ("reduction", "backend", "cache_bias")
"""The options of :func:`vq_attention` that context parallelism passes on: those acting on each query alone."""

# The options context parallelism takes at their defaults only, and why, then (key None) any other. A rank's refusal
# travels to the others as an index into this table (the text cannot), so that every rank words it alike.
OPTION_REFUSALS = {
    "compressive_cache": "context parallelism hands each rank the per-code cache of the ranks before it: "
                         "compressive_cache=False is not supported with it; leave compressive_cache at True",
    "doc_start": "context parallelism exchanges summaries of whole chunks that ignore packed documents: doc_start "
                 "is not supported with it; pack documents without context parallelism",
    "code_scores": "context parallelism computes every chunk's code scores itself: code_scores is not supported "
                   "with it; leave it out",
    None: f"context parallelism takes only the options {', '.join(HONOURED_OPTIONS)} of vq_attention (and "
          f"compressive_cache=True): leave the others out",
}


def refused_option(options: dict) -> int | None:
    """The index in ``OPTION_REFUSALS`` of the first of ``options`` that context parallelism does not honour (``None``:
    it honours them all)."""
    names = list(OPTION_REFUSALS)
    for name, value in options.items():
        at_default = bool(value) if name == "compressive_cache" else value is None
        if name not in HONOURED_OPTIONS and not (name in names and at_default):
            return names.index(name if name in names else None)
    return None


def check_options(options: dict) -> None:
    """Raise ``ValueError`` unless context parallelism honours every one of ``options``."""
    refused = refused_option(options)
    if refused is not None:
        raise ValueError(list(OPTION_REFUSALS.values())[refused])


def vq_attention_context_parallel_reference(
    q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int, ranks: int,
    z: torch.Tensor, codebook: torch.Tensor, state: VQAttentionState | None = None, **options,
) -> tuple[torch.Tensor, VQAttentionState]:
    """``R = ranks`` simulated in one process: each chunk attends from the state composed of the summaries of the
    chunks before it. Same arguments and results as :func:`~transformer_vq.ops.vq.vq_attention` (``options``: those
    of ``HONOURED_OPTIONS``); ``T`` must split into ``R`` chunks of whole blocks."""
    check_options(options)
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
    (sum it over the group). ``options``: those of ``HONOURED_OPTIONS``; any other is refused (``OPTION_REFUSALS``).
    A chunk or an option refused on any rank raises the same ``ValueError`` on every rank, after the exchange.

    Every rank of the group must call this the same number of times, in the same order, and use ``out`` in its
    loss: the backward holds one collective, which each rank joins through ``out``.
    """
    rank = dist.get_rank(group)
    problem = input_problem(q, k_hat, v, bias, block_len, z, codebook, state, options)
    refusal = local_refusal(k_hat.shape[2], block_len, options, problem)
    like = v.new_zeros(()).to(torch.promote_types(v.dtype, torch.float32))  # the accumulators' dtype and device
    state = _start(state, q, v, codebook) if not refusal else None
    layout = summary_layout(k_hat, v, codebook.shape[-2] if codebook.dim() == 3 else 0, block_len, like.dtype)
    # A refusing rank still joins the exchange (with zeros of the same size), so that no rank waits for it.
    local = None if refusal else chunk_summary(k_hat, v, z, block_len=block_len, n_code=codebook.shape[1],
                                               acc_dtype=like.dtype)
    gathered = _GatherSummaries.apply(pack(local, layout, k_hat.shape[2], refusal, like), group)  # (R, numbers)
    lengths = agreed_lengths(gathered, block_len, own=(rank, problem))
    summaries = [unpack(row, layout, length) for row, length in zip(gathered.unbind(0), lengths)]
    states = prefix_states(state, summaries, block_len)
    # checked before the exchange (input_problem): the rest of the call, whose checks of the composed state remain
    out, _ = attend_checked(q, k_hat, v, bias, block_len, states[rank], z, codebook, options.get("reduction", "serial"),
                            None, True, options.get("backend", "eager"), None, options.get("cache_bias"))
    # Rank 0's incoming state holds no summary, so without this its backward would never reach the gather, and the
    # collective there would wait forever for it. The tie adds nothing to any gradient.
    return _Tie.apply(out, gathered), states[-1]


def _start(state, q, v, codebook) -> VQAttentionState:
    """``state``, or the empty state of the start of a sequence."""
    if state is not None:
        return state
    B, G, (S, Dk) = q.shape[0], v.shape[1], codebook.shape[1:]
    return VQAttentionState.empty(B, G, S, Dk, v.shape[-1], dtype=v.dtype, device=v.device)


# What a rank refuses of its own input, as the number it sends with its summary: nothing, its chunk's length, what
# the operator checks of its tensors, or 3 + the index of an option in OPTION_REFUSALS.
_ACCEPTED, _BAD_LENGTH, _BAD_INPUT, _FIRST_OPTION = 0, 1, 2, 3
_HEADER = 2  # numbers before the summary in a packed row: the chunk length and the refusal


def input_problem(q, k_hat, v, bias, block_len: int, z, codebook, state, options: dict) -> str | None:
    """Why :func:`vq_attention` would refuse this rank's tensors, state or backend (``None``: it would take them),
    found before the exchange; raised inside the rank's own call after it, the refusal would leave the other ranks
    waiting in the backward's all-reduce."""
    try:
        check_vq_call(q, k_hat, v, bias, block_len, z, codebook, options.get("reduction", "serial"), None, True)
        if state is not None:
            check_vq_state(state, q, v, codebook, block_len)
        kernels(options.get("backend", "eager"), q, None, True, options.get("cache_bias"))
    except (ValueError, TypeError) as error:
        return str(error)
    return None


def local_refusal(length: int, block_len: int, options: dict, problem: str | None = None) -> int:
    """What this rank refuses of its chunk of ``length`` tokens, ``options`` and its tensors (``problem``: what
    :func:`input_problem` found), as :func:`refusal_text` reads it."""
    refused = refused_option(options)
    if refused is not None:
        return _FIRST_OPTION + refused
    if chunk_length_problem(length, block_len):
        return _BAD_LENGTH
    return _BAD_INPUT if problem else _ACCEPTED


def refusal_text(refusal: int, length: int, block_len: int) -> str:
    """The error of a rank whose :func:`local_refusal` was ``refusal`` for its chunk of ``length`` tokens."""
    if refusal == _BAD_LENGTH:
        return chunk_length_problem(length, block_len)
    if refusal == _BAD_INPUT:
        return "vq_attention refused this rank's input (that rank's own error says why)"
    return list(OPTION_REFUSALS.values())[refusal - _FIRST_OPTION]


def agreed_lengths(gathered: torch.Tensor, block_len: int, own: tuple[int, str | None] = (-1, None)) -> list[int]:
    """The chunk lengths in the headers of the gathered rows; raises ``ValueError`` on every rank (which all hold the
    same rows) for the first rank that refused its input, the same text on each but on that rank itself when ``own``
    (this rank and the problem :func:`input_problem` found) gives its reason."""
    header = gathered.detach()[:, :_HEADER].tolist()  # one read of every rank's header (a host sync on a GPU)
    for rank, (length, refusal) in enumerate(header):
        if refusal == _BAD_INPUT and own[0] == rank:
            raise ValueError(f"rank {rank}: {own[1]}")
        if refusal != _ACCEPTED:
            raise ValueError(f"rank {rank}: {refusal_text(int(refusal), int(length), block_len)}")
    return [int(length) for length, _ in header]


def summary_layout(k_hat: torch.Tensor, v: torch.Tensor, n_code: int, block_len: int,
                   acc_dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The fields of a chunk's summary, with their shapes and dtypes, in the order :func:`pack` lays them out: the
    same on every rank whatever the length of its chunk (what :func:`chunk_summary` returns)."""
    (B, G, _, Dk), Dv, L = k_hat.shape, v.shape[-1], block_len
    return [("count", (B, G, n_code), torch.float32), ("mean", (B, G, n_code, Dv), acc_dtype),
            ("last_k", (B, G, L, Dk), k_hat.dtype), ("last_v", (B, G, L, Dv), v.dtype),
            ("last_z", (B, G, L), torch.long)]


def pack(summary: ChunkSummary | None, layout, length: int, refusal: int, like: torch.Tensor) -> torch.Tensor:
    """One flat tensor (``like``'s dtype and device), one collective instead of six: the chunk length, the rank's
    refusal (:func:`local_refusal`) and the summary; zeros in its place when the rank refused (``summary`` None).

    The codes and counts are whole numbers below ``2^24``, exact in float32 and float64; the length rides along so
    that chunks may differ in length.
    """
    header = torch.tensor([float(length), float(refusal)], dtype=like.dtype, device=like.device)
    if summary is None:
        return torch.cat([header, like.new_zeros(sum(math.prod(shape) for _, shape, _ in layout))])
    return torch.cat([header] + [getattr(summary, name).to(like.dtype).reshape(-1) for name, _, _ in layout])


def unpack(flat: torch.Tensor, layout, length: int) -> ChunkSummary:
    """The summary that :func:`pack` flattened, in the dtypes of ``layout``; counts and codes carry no gradient."""
    fields, start = {}, _HEADER
    for name, shape, dtype in layout:
        size = math.prod(shape)
        field = flat[start:start + size].view(shape).to(dtype)
        fields[name] = field.detach() if name in ("count", "last_z") else field
        start += size
    return ChunkSummary(length=length, **fields)


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
    """``out`` unchanged; in the backward a zero gradient for ``anchor``, so that ``anchor``'s graph is always
    walked."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, anchor: torch.Tensor):
        ctx.anchor_shape, ctx.anchor_dtype = anchor.shape, anchor.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_zeros(ctx.anchor_shape, dtype=ctx.anchor_dtype)
