"""The FLASH baselines (Hua et al. 2022): squared-ReLU attention, quadratic (FLASH-Quad) and mixed-chunk (FLASH).

Both follow the FLASH paper's Code 6 and Code 8 (App. D), adapted to the project's operator signature.

**FLASH-Quad** (``attn_type="flash_quad"``) replaces the softmax by a squared ReLU over every past key:

    out[t] = sum_{p <= tau} relu( q[t] . k[p] / n  +  beta[t, p] )^2  v[p]

The paper divides the scores by the sequence length ``n`` of the training window (Code 6: ``qk / seq_len``). An operator
that can be continued through a state must not depend on the length of the call, so ``n`` is a fixed ``norm_len``
here (default ``block_len``); with ``norm_len = chunk_len`` FLASH-Quad is FLASH with one chunk, which the tests check.

**FLASH** (``attn_type="flash"``) splits the positions into chunks of ``C = chunk_len`` aligned to absolute positions
``0, C, 2C, ...`` and adds (Sec. 3.2, Eq. 8, Code 8)

* a quadratic part inside each chunk: ``relu(q[t] . k[p] / C + beta[t, p])^2`` over keys ``p <= tau`` of the same
  chunk, ``C`` playing the role of ``n``;
* a linear part across chunks: ``q[t] . M_c``, with ``M_c`` the mean over earlier chunks of ``sum_p k[p] v[p]^T / C``
  (Code 8 normalizes the causal chunk mask by its row sums), that is ``sum over all keys of earlier chunks of
  k[p] v[p]^T``, divided by their number. The first chunk has no linear part.

Position terms. FLASH uses RoPE plus a learned relative-position bias inside the quadratic part. The project's layers
hand every operator the same two-block window bias (docs/operator.md), so both operators add that
``beta`` where FLASH adds its relative bias: inside the quadratic part, for keys in the query's two-block window (zero
for older keys). A chunk never spans more than the window when ``C <= L``; with ``C > L`` the older keys of a chunk get
no bias, exactly as in the other operators. The linear part has no position term, as in the paper.

FLASH's separate per-dimension scale/offset heads for the quadratic and linear queries/keys (4 x s parameters) are not
modelled: the project's layer produces one query and one key per position, and both parts use them.

Letters: B batch, H query heads, G key/value groups (G divides H), Hg = H / G, T positions of the call, N chunks,
C chunk length, Dk key width, Dv value width, L block length, R query rows of a block, P key positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.flash.state import FlashState
from transformer_vq.ops.full.state import KVCache, continue_cache
from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.protocol import check_documents, check_inputs, check_positive_int, check_state
from transformer_vq.ops.window import row_blocks, window_bias


def _relu2_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, visible: torch.Tensor,
                  norm_len: int) -> torch.Tensor:
    """``sum_p relu(q . k[p] / n + beta)^2 v[p]`` over visible keys, heads grouped onto their key/value group.

    Shapes: ``q [B, H, *, R, Dk]``, ``k [B, G, *, P, Dk]``, ``v [B, G, *, P, Dv]``, ``beta [B, H, *, R, P]``,
    ``visible [*, R, P]``; returns ``[B, H, *, R, Dv]``.
    """
    batch, n_head = q.shape[:2]
    n_group = k.shape[1]
    grouped = q.reshape(batch, n_group, n_head // n_group, *q.shape[2:])  # [B, G, Hg, *, R, Dk]
    scores = grouped @ k.unsqueeze(2).transpose(-1, -2)  # [B, G, Hg, *, R, P]
    scores = scores.reshape(beta.shape) / norm_len + beta  # [B, H, *, R, P]
    weights = F.relu(scores).square().masked_fill(~visible, 0.0)
    out = weights.reshape(scores.shape[:1] + (n_group, n_head // n_group) + scores.shape[2:]) @ v.unsqueeze(2)
    return out.reshape(*q.shape[:-1], v.shape[-1])  # [B, H, *, R, Dv]


def flash_quad_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int,
                         state: KVCache | None = None, norm_len: int | None = None,
                         doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
    """FLASH-Quad: causal squared-ReLU attention over the whole sequence (FLASH paper, Code 6).

    Args:
        q: ``[B, H, T, Dk]`` queries; k: ``[B, G, T, Dk]`` keys; v: ``[B, G, T, Dv]`` values.
        bias: ``[B, H, T, 2L]`` per-(query, offset) bias on the two-block window.
        block_len: ``L``.
        state: the key/value cache of a previous call on the earlier part of the same sequences.
        norm_len: the ``n`` scores are divided by (default ``block_len``).
        doc_start: ``[B, T]`` bool, True where a packed document begins: a query attends only keys of its own.

    Returns:
        ``out [B, H, T, Dv]`` and the cache extended by this call's keys and values.
    """
    check_inputs(q, k, v, bias, block_len)
    check_documents(q, doc_start)
    norm_len = block_len if norm_len is None else norm_len
    check_positive_int(norm_len, "norm_len")  # the scores are divided by it: 0 would give NaN, < 0 flip their sign
    offset = 0 if state is None else state.offset
    cache = continue_cache(state, q, k, v, doc_start)
    outputs = []
    # One absolute block of query rows at a time keeps the score matrix at [L, T], never [T, T].
    for start, stop, _ in row_blocks(offset, q.shape[2], block_len):
        end = offset + stop
        q_pos = torch.arange(offset + start, end, device=q.device)
        beta, visible = window_bias(bias[:, :, start:stop], q_pos, torch.arange(end, device=q.device), block_len)
        if cache.segment is not None:  # [B, 1, R, end]: keys of the query's own packed document
            visible = visible & (cache.segment[:, None, offset + start:end, None] == cache.segment[:, None, None, :end])
        outputs.append(_relu2_attend(q[:, :, start:stop], cache.k[:, :, :end], cache.v[:, :, :end], beta, visible,
                                     norm_len))
    return torch.cat(outputs, dim=2), cache


_STATE_DTYPES = {"kv_sum": None, "chunk_k": None, "chunk_v": None, "kv_count": None, "chunk_start": torch.bool}
"""The dtype of each tensor of a :class:`FlashState` (``None``: one of the call's,
:func:`~transformer_vq.ops.protocol.call_dtypes`)."""


def _starting_state(state: FlashState | None, q, k, v, chunk_len: int) -> FlashState:
    """The state a call starts from: empty, or ``state`` once checked to continue these sizes and chunk length."""
    check_positive_int(chunk_len, "chunk_len")
    (batch, n_group, _, d_k), d_v = k.shape, v.shape[-1]
    if state is None:
        return FlashState(q.new_zeros(batch, n_group, d_k, d_v), 0, chunk_len, k[:, :, :0], v[:, :, :0])
    # the open chunk's own length where it has one: exact shapes are compared by one comparison each
    opened = state.chunk_k.shape[2] if isinstance(state, FlashState) and state.chunk_k.dim() == 4 else -1
    check_state(state, FlashState, {"kv_sum": (batch, n_group, d_k, d_v), "chunk_k": (batch, n_group, opened, d_k),
                                    "chunk_v": (batch, n_group, opened, d_v), "kv_count": (batch,),
                                    "chunk_start": (batch, opened)}, q, _STATE_DTYPES)
    if state.chunk_len != chunk_len:
        raise ValueError(f"state was built with chunk_len={state.chunk_len}, got chunk_len={chunk_len}")
    return state


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *, block_len: int,
                    state: FlashState | None = None, chunk_len: int,
                    doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, FlashState]:
    """FLASH mixed-chunk attention: squared-ReLU inside chunks plus causal linear attention across chunks.

    Args:
        q: ``[B, H, T, Dk]`` queries; k: ``[B, G, T, Dk]`` keys; v: ``[B, G, T, Dv]`` values.
        bias: ``[B, H, T, 2L]`` per-(query, offset) bias on the two-block window.
        block_len: ``L`` of the window bias.
        state: what a previous call on the earlier part of the same sequences returned.
        chunk_len: ``C``, the chunk length (the paper uses 256).
        doc_start: ``[B, T]`` bool, True where a packed document begins: both parts sum over the query's own
            document only (the linear part's mean over its keys in earlier chunks).

    Returns:
        ``out [B, H, T, Dv]`` and the state after this call. The work per call is ``O((r + T) C (Dk + Dv))`` with
        ``r < C`` positions of an open chunk, so one decoding step costs the same at any offset.
    """
    check_inputs(q, k, v, bias, block_len)
    check_documents(q, doc_start)
    state = _starting_state(state, q, k, v, chunk_len)
    batch, n_head, length, d_k = q.shape
    n_group, d_v = k.shape[1], v.shape[-1]
    # Lay the open chunk and this call's positions on a grid of whole chunks aligned to absolute positions.
    opened = state.chunk_k.shape[2]
    k_all = torch.cat([state.chunk_k, k], dim=2)  # [B, G, r + T, Dk]
    v_all = torch.cat([state.chunk_v, v], dim=2)  # [B, G, r + T, Dv]
    used = opened + length
    n_chunk = -(-used // chunk_len)
    pad = n_chunk * chunk_len - used
    k_grid = F.pad(k_all, (0, 0, 0, pad)).view(batch, n_group, n_chunk, chunk_len, d_k)
    v_grid = F.pad(v_all, (0, 0, 0, pad)).view(batch, n_group, n_chunk, chunk_len, d_v)
    # The open chunk's earlier rows get dummy queries whose outputs are dropped below.
    q_grid = F.pad(q, (0, 0, opened, pad)).view(batch, n_head, n_chunk, chunk_len, d_k)
    bias_grid = F.pad(bias, (0, 0, opened, pad)).view(batch, n_head, n_chunk, chunk_len, 2 * block_len)
    pos = (state.n_chunks * chunk_len + torch.arange(n_chunk * chunk_len, device=q.device)).view(n_chunk, chunk_len)
    starts, docs = _chunk_documents(state, doc_start, batch, n_chunk, used)

    beta, visible = window_bias(bias_grid, pos, pos, block_len)  # [B, H, N, C, C], [N, C, C]
    if docs is not None:
        visible = visible & docs.same_document[:, None]  # [B, 1, N, C, C]
    quadratic = _relu2_attend(q_grid, k_grid, v_grid, beta, visible, chunk_len)  # [B, H, N, C, Dv]
    mean_kv, kv_sum, kv_count = _linear_means(k_grid, v_grid, state, used, docs)  # mean_kv [B, G, N, Dk, Dv]
    grouped = q_grid.view(batch, n_group, n_head // n_group, n_chunk, chunk_len, d_k)
    linear = (grouped @ mean_kv.unsqueeze(2)).view(batch, n_head, n_chunk, chunk_len, d_v)
    if docs is not None:  # a query whose document began in its own chunk has no earlier keys
        linear = linear * docs.sees_earlier[:, None, :, :, None].to(linear.dtype)

    out = (quadratic + linear).view(batch, n_head, n_chunk * chunk_len, d_v)[:, :, opened:used]
    finished = used // chunk_len
    # the open chunk copied: a slice would keep the whole call's keys and values alive beside the state
    new_state = FlashState(kv_sum, state.n_chunks + finished, chunk_len, k_all[:, :, finished * chunk_len:].clone(),
                           v_all[:, :, finished * chunk_len:].clone(), kv_count,
                           None if docs is None else starts[:, finished * chunk_len:].clone())
    return out, new_state


class ChunkDocuments:
    """Where packed documents fall in the chunk grid, from its starts ``[B, N, C]`` (``used`` real positions).

    * ``same_document [B, N, C, C]``: key and query of a chunk in one document;
    * ``sees_earlier [B, N, C]``: the query's document began before its chunk (it has keys in earlier chunks);
    * ``tail [B, N, C]``: the real keys after the chunk's last start, the ones later chunks may sum over;
    * ``keep [B, N]``: no document begins in the chunk (else the sum over earlier chunks restarts there).
    """

    def __init__(self, starts: torch.Tensor, used: int):
        B, N, C = starts.shape
        segment = segment_ids(starts.view(B, N * C)).view(B, N, C)
        self.same_document = segment[..., :, None] == segment[..., None, :]
        self.sees_earlier = segment == (segment[..., :1] - starts[..., :1].to(torch.long))
        real = (torch.arange(N * C, device=starts.device) < used).view(N, C)
        self.tail = (segment == segment[..., -1:]) & real
        self.keep = ~starts.any(dim=-1)


def _chunk_documents(state: FlashState, doc_start, batch: int, n_chunk: int, used: int):
    """The starts ``[B, r + T]`` of the open chunk's and this call's positions and their :class:`ChunkDocuments`, or
    ``(None, None)`` when no packed document was ever given to these sequences."""
    if doc_start is None and state.kv_count is None:
        return None, None
    opened, chunk_len, device = state.chunk_k.shape[2], state.chunk_len, state.chunk_k.device
    parts = [state.chunk_start, doc_start]
    if parts[0] is None:
        parts[0] = torch.zeros(batch, opened, dtype=torch.bool, device=device)
    if parts[1] is None:
        parts[1] = torch.zeros(batch, used - opened, dtype=torch.bool, device=device)
    starts = torch.cat(parts, dim=1)
    grid = F.pad(starts, (0, n_chunk * chunk_len - used)).view(batch, n_chunk, chunk_len)
    return starts, ChunkDocuments(grid, used)


def _linear_means(k_grid, v_grid, state: FlashState, used: int, docs: ChunkDocuments | None):
    """The mean of ``k v^T`` over the earlier keys of each chunk's queries ``[B, G, N, Dk, Dv]``, and the sum and count
    the state carries after the finished chunks.

    Code 8: the mean over earlier chunks of (chunk sum / C), that is the sum over every earlier key divided by their
    number. With packed documents the sum runs over the document of the last earlier key: the per-chunk sums keep
    the keys after a chunk's last start and their prefix restarts at every chunk holding a start.
    """
    B, G, N, C, _ = k_grid.shape
    finished = used // C
    if docs is None:
        kv = k_grid.transpose(-1, -2) @ v_grid  # [B, G, N, Dk, Dv] per-chunk sums of k v^T
        running = torch.cumsum(kv, dim=2)  # [B, G, N, Dk, Dv] inclusive
        before = state.kv_sum.unsqueeze(2) + F.pad(running[:, :, :-1], (0, 0, 0, 0, 1, 0))  # exclusive, plus the state
        n_keys = ((state.n_chunks + torch.arange(N, device=k_grid.device)) * C).clamp(min=1)  # [N]
        kv_sum = state.kv_sum + running[:, :, finished - 1] if finished > 0 else state.kv_sum
        return before / n_keys.to(before.dtype)[:, None, None], kv_sum, None
    tail = docs.tail.to(k_grid.dtype)  # [B, N, C]
    kv = (k_grid * tail[:, None, :, :, None]).transpose(-1, -2) @ v_grid  # [B, G, N, Dk, Dv] over the tails
    count = tail.sum(dim=-1)  # [B, N]
    restarts = (~docs.keep).to(torch.long).cumsum(dim=1)  # [B, N]
    lower = torch.ones(N, N, dtype=torch.bool, device=k_grid.device).tril() & (
        restarts[:, :, None] == restarts[:, None, :])  # [B, N, N]: i <= n, no start in i+1 .. n
    carried = (restarts == 0).to(k_grid.dtype)  # [B, N]: the state's sum still counts
    state_count = state.kv_count if state.kv_count is not None else torch.full(
        (B,), float(state.n_chunks * C), dtype=k_grid.dtype, device=k_grid.device)
    lower = lower.to(k_grid.dtype)
    inclusive = (torch.einsum("bni,bgi...->bgn...", lower, kv)
                 + carried[:, None, :, None, None] * state.kv_sum[:, :, None])
    inclusive_count = (lower @ count[..., None]).squeeze(-1) + carried * state_count[:, None]
    before = torch.cat([state.kv_sum[:, :, None], inclusive[:, :, :-1]], dim=2)
    before_count = torch.cat([state_count[:, None], inclusive_count[:, :-1]], dim=1)  # [B, N]
    mean = before / before_count.clamp(min=1.0)[:, None, :, None, None]
    if finished == 0:
        return mean, state.kv_sum, state_count
    # copied out of the sums through every chunk, which would otherwise stay alive beside the state
    return mean, inclusive[:, :, finished - 1].clone(), inclusive_count[:, finished - 1].clone()
