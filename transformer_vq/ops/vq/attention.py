"""Linear-time VQ attention: Theorem 3.7 of the paper, in the running-mean form of Remark 3.9.

The operator's contract (shapes, the window bias, state, the gradient truncation for keys, reductions) is in
docs/operator.md. Where the math lives:

* :mod:`transformer_vq.ops.vq.cache`: the per-code cache (count and mean summaries, their merge, the prefix over
  blocks by each reduction);
* :mod:`transformer_vq.ops.vq.kernels`: the two kernels (within one block, whole blocks) and their shared softmax;
* :mod:`transformer_vq.ops.vq.state`: what a call hands the next one;
* :mod:`transformer_vq.ops.vq.naive`: the dense formula and a plain block-by-block loop, the oracles of the tests.

This module splits a call into at most three segments, each handled by one kernel.

Letters: B batch, H query heads, G key/value groups, T tokens in this call, L block length, S codewords, Dk key width,
Dv value width.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from transformer_vq.config import ATTN_BACKENDS, REDUCTIONS
from transformer_vq.ops.protocol import (check_bool, check_code_range, check_devices, check_documents, check_finite,
                                         check_floating, check_inputs, check_is_tensor, check_like)
from transformer_vq.ops.vq.kernels import attend_blocks, attend_within_block
from transformer_vq.ops.vq.state import VQAttentionState, check_vq_state


def vq_attention(
    q: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
    *,
    block_len: int,
    state: VQAttentionState | None = None,
    z: torch.Tensor,
    codebook: torch.Tensor,
    reduction: str = "serial",
    code_scores: torch.Tensor | None = None,
    compressive_cache: bool = True,
    backend: str = "eager",
    doc_start: torch.Tensor | None = None,
    cache_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, VQAttentionState]:
    """Causal softmax attention over all past keys, in time linear in the sequence length: ``(out, state)``,
    ``out [B, H, T, Dv]`` and the state that continues the sequences.

    Args:
        q: ``[B, H, T, Dk]`` queries.
        k_hat: ``[B, G, T, Dk]`` quantized keys, equal in value to ``codebook[g, z]``.
        v: ``[B, G, T, Dv]`` values.
        bias: ``[B, H, T, 2L]`` bias of each query to the keys of its two-block window: column ``j`` is
            the key at absolute position ``(tau // L - 1) * L + j`` for the query at position ``tau``.
        block_len: ``L``.
        state: what the previous call on the same sequences returned (``None``: start of sequence).
        z: ``[B, G, T]`` int64 shortcodes, ``0 <= z < S``.
        codebook: ``[G, S, Dk]`` codewords (treated as constants: no gradient flows to them).
        reduction: how per-block cache summaries are accumulated across blocks: ``"serial"`` (a scan),
            ``"matmul"`` (a lower-triangular weighted product) or ``"assoc"`` (an associative scan).
        code_scores: ``[B, H, T, S]`` the scores ``q @ codebook[h // (H // G)]^T`` when the caller has them without
            the product (quantized queries: :mod:`transformer_vq.ops.vq_qk`), equal to it; gradients as the caller's.
        compressive_cache: ``False`` drops the per-code cache: each query attends its two-block window only (the
            paper's Table 2 ablation). The state then carries the window keys alone (its cache stays empty).
        backend: whole blocks by ``"eager"`` torch ops or ``"triton"`` fused kernels (docs/operator.md).
        doc_start: ``[B, T]`` bool, True where a packed document begins (:mod:`transformer_vq.ops.documents`):
            a query attends only keys of its own document, those of earlier calls included.
        cache_bias: ``[H]`` a logit per head on each key older than the window: an extension (docs/operator.md).
    """
    check_vq_call(q, k_hat, v, bias, block_len, z, codebook, reduction, code_scores, compressive_cache)
    return attend_checked(q, k_hat, v, bias, block_len, state, z, codebook, reduction, code_scores, compressive_cache,
                          backend, doc_start, cache_bias)


def check_vq_call(q, k_hat, v, bias, block_len, z, codebook, reduction, code_scores, compressive_cache) -> None:
    """The checks :func:`vq_attention` runs before :func:`attend_checked` (which checks the rest): its options, the
    tensors every operator shares, the codes and the code scores."""
    check_vq_options(reduction, compressive_cache)
    check_inputs(q, k_hat, v, bias, block_len, key_name="k_hat")
    check_codes(q, k_hat, z, codebook)
    check_code_scores(q, code_scores, codebook.shape[1])


def attend_checked(q, k_hat, v, bias, block_len, state, z, codebook, reduction, code_scores, compressive_cache,
                   backend, doc_start, cache_bias):
    """:func:`vq_attention` once its inputs, options and codes have passed their checks (the state, ``doc_start``,
    ``backend`` and ``cache_bias`` are checked here). The quantized-query operator checks the same inputs under its
    own names and calls this: checked twice, the codes' range would be read twice at every decoded token."""
    T, L = q.shape[2], block_len
    state, doc_start = _starting_state(state, doc_start, q, v, codebook, L)
    within_kernel, blocks_kernel = kernels(backend, q, code_scores, compressive_cache, cache_bias)
    codebook = codebook.detach()
    # On a GPU, or under autograd (the backward keeps every piece's tensors anyway), one piece of whole blocks; on a
    # CPU without autograd, pieces of SEGMENT_ROWS' worth of blocks, written into one output as they come.
    one_piece = _recording(q, k_hat, v, bias, code_scores, cache_bias) or q.device.type != "cpu"
    per_piece = T // L if one_piece else max(1, SEGMENT_ROWS // (q.shape[0] * q.shape[1] * L))
    pieces, outs = _segments(state.offset, T, L, per_piece), []
    out = None if one_piece or len(pieces) == 1 else q.new_empty(*q.shape[:3], v.shape[-1])
    for piece, whole_blocks in pieces:
        kernel = blocks_kernel if whole_blocks else within_kernel
        piece_out, state = kernel(q[:, :, piece], k_hat[:, :, piece], z[:, :, piece], v[:, :, piece], codebook,
                                  bias[:, :, piece], L, state, reduction,
                                  None if code_scores is None else code_scores[:, :, piece], compressive_cache,
                                  None if doc_start is None else doc_start[:, piece])
        if out is None:
            outs.append(piece_out)
        else:
            out[:, :, piece] = piece_out
    return (out if out is not None else outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), state


def _recording(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records an op on these tensors (``None`` entries skipped)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _segments(offset: int, T: int, L: int, max_blocks: int) -> list[tuple[slice, bool]]:
    """The pieces of a call of ``T`` queries from position ``offset``, each with whether it is whole blocks (else it
    lies inside one block): the head up to the first block boundary, runs of at most ``max_blocks`` whole blocks, and
    a short tail."""
    pieces, start = [], 0
    while start < T:
        in_block = (offset + start) % L
        if in_block != 0 or T - start < L:
            stop, whole_blocks = start + min(L - in_block, T - start), False
        else:
            stop, whole_blocks = start + min((T - start) // L, max_blocks) * L, True
        pieces.append((slice(start, stop), whole_blocks))
        start = stop
    return pieces


SEGMENT_ROWS = 4096
"""On a CPU without autograd, whole blocks are attended ``SEGMENT_ROWS // (B H L)`` blocks at a time (at least one),
the state carried from piece to piece, which is the same computation (a call's state is its exact continuation).
Every tensor the kernel makes (the scores, the per-block summaries of the values and their prefixes, the values with
the previous block prepended) then scales with the piece, not with ``T``: at 32k tokens of the enwik8 layer they
were 1.0 GiB at the forward's peak, about 10 times a piece's, and fresh tensors that large are page-faulted in at
every call. Under autograd nothing is gained (the backward keeps every piece's tensors; pieces measured slower), and a
GPU wants the blocks of a call in parallel, so there a call is one piece."""


def _starting_state(state, doc_start, q, v, codebook, block_len):
    """The state to start from (empty at the start of the sequences) and the document starts of this call: zeros
    rather than ``None`` when a document begun in an earlier call is still in the window (its earlier keys stay
    hidden)."""
    (B, _, T, Dk), (G, S) = q.shape, codebook.shape[:2]
    check_documents(q, doc_start)
    if state is None:
        return VQAttentionState.empty(B, G, S, Dk, v.shape[-1], dtype=v.dtype, device=v.device), doc_start
    check_vq_state(state, q, v, codebook, block_len)
    if doc_start is None and state.documents:
        doc_start = torch.zeros(B, T, dtype=torch.bool, device=q.device)
    return state, doc_start


def kernels(backend: str, q: torch.Tensor, code_scores, compressive_cache: bool, cache_bias):
    """The kernels of part-block pieces and of whole blocks, each given ``cache_bias`` when there is one (the eager
    kernels only, which :func:`check_cache_bias` asks for)."""
    check_cache_bias(q, cache_bias, compressive_cache, backend)
    kernels = attend_within_block, _blocks_kernel(backend, q, code_scores, compressive_cache)
    if cache_bias is None:
        return kernels
    return tuple(functools.partial(kernel, cache_bias=cache_bias) for kernel in kernels)


def _blocks_kernel(backend: str, q: torch.Tensor, code_scores, compressive_cache: bool):
    """The kernel of whole blocks of ``backend``; triton is imported only when asked for (an optional extra)."""
    if backend not in ATTN_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(ATTN_BACKENDS)}, got {backend!r}")
    if backend == "eager":
        return attend_blocks
    problem = triton_problem(q.device)
    if problem is not None:
        raise problem
    from transformer_vq.ops.vq.triton import attend_blocks_fused, check_fused_inputs

    check_fused_inputs(q, code_scores, compressive_cache)
    return attend_blocks_fused


def triton_problem(device: torch.device | str) -> Exception | None:
    """Why ``backend='triton'`` cannot run on ``device`` on this machine, as the error to raise (``None``: it can).

    One check for the operator and for the commands, which call it before they create anything (a run directory)."""
    eager = "backend='eager' (attn_backend 'eager' in a model config) is the same attention"
    if importlib.util.find_spec("triton") is None:  # once imported, a lookup in sys.modules
        return ImportError(f"backend='triton' needs the triton package: pip install -e \".[triton]\"; or {eager}")
    kind = torch.device(device).type
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return ValueError(f"backend='triton' runs on CUDA tensors, got {kind}; on a CPU set TRITON_INTERPRET=1 "
                          f"before the first import of triton to run its interpreter; or {eager}")
    return None


def check_vq_options(reduction: str, compressive_cache: bool) -> None:
    """Raise ``ValueError`` unless ``reduction`` is one of ``REDUCTIONS`` and ``compressive_cache`` a bool."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    check_bool(compressive_cache, "compressive_cache")


def check_cache_bias(q: torch.Tensor, cache_bias: torch.Tensor | None, compressive_cache: bool, backend: str) -> None:
    """Raise ``ValueError`` unless ``cache_bias`` is ``None`` or a finite ``[H]`` tensor the call can add to its
    cache (finite where :func:`~transformer_vq.ops.protocol.reads_values` allows: ``+inf`` makes every row NaN)."""
    if cache_bias is None:
        return
    n_head = q.shape[1]
    if not isinstance(cache_bias, torch.Tensor) or cache_bias.shape != (n_head,):
        got = list(cache_bias.shape) if isinstance(cache_bias, torch.Tensor) else type(cache_bias).__name__
        raise ValueError(f"cache_bias must be [H] = [{n_head}] (one logit per query head), got {got}")
    if not compressive_cache:
        raise ValueError("cache_bias is added to the scores of the per-code cache: with compressive_cache=False "
                         "there is none; pass cache_bias=None")
    if backend != "eager":
        raise ValueError(f"cache_bias is taken by backend='eager' only (the fused kernels' log-counts carry no "
                         f"gradient), got backend={backend!r}")
    check_like(q, {"cache_bias": cache_bias})
    check_finite(cache_bias, "cache_bias")


def check_codes(q: torch.Tensor, k_hat: torch.Tensor, z: torch.Tensor, codebook: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``codebook`` is ``[G, S, Dk]`` of a dtype of the call and ``z`` int64
    ``[B, G, T]`` in ``[0, S)`` for ``k_hat``, both on ``q``'s device."""
    check_is_tensor(codebook, "codebook")
    check_is_tensor(z, "z")
    B, G, T, Dk = k_hat.shape
    if codebook.dim() != 3 or codebook.shape[0] != G or codebook.shape[2] != Dk:
        raise ValueError(f"codebook must be [G, S, Dk] = [{G}, S, {Dk}], got {list(codebook.shape)}")
    if z.shape != (B, G, T):
        raise ValueError(f"z must be [B, G, T] = [{B}, {G}, {T}], got {list(z.shape)}")
    if z.dtype != torch.long:
        raise ValueError(f"z must be int64 shortcodes, got {z.dtype}")
    check_devices(q, {"z": z})
    check_like(q, {"codebook": codebook})
    check_code_range(z, codebook.shape[1], "z", "S")


def check_code_scores(q: torch.Tensor, code_scores: torch.Tensor | None, n_code: int) -> None:
    """Raise ``ValueError`` unless ``code_scores`` is ``None`` or a floating ``[B, H, T, S]`` tensor on ``q``'s
    device. Any floating dtype: the scores are added to the log-counts in at least float32 (a table the caller
    holds from an autocast call is bfloat16)."""
    if code_scores is None:
        return
    check_is_tensor(code_scores, "code_scores")
    if code_scores.shape != (*q.shape[:3], n_code):
        raise ValueError(f"code_scores must be [B, H, T, S] = {[*q.shape[:3], n_code]}, "
                         f"got {list(code_scores.shape)}")
    check_floating(code_scores, "code_scores")
    check_devices(q, {"code_scores": code_scores})
