"""Whole blocks of VQ attention through the fused Triton kernels: the ``backend="triton"`` counterpart of
:func:`transformer_vq.ops.vq.kernels.attend_blocks`.

What stays in torch: the window keys and values of blocks ``-1 .. N-1``, the per-block summaries and their prefix
over blocks by the chosen reduction (:func:`transformer_vq.ops.vq.kernels.block_prefixes`), the log-counts and the
final state. What is fused: every score against codewords and window keys, the softmax and the output, and their
backward (:mod:`transformer_vq.ops.vq.triton.function`).
"""

from __future__ import annotations

import torch

from transformer_vq.ops.vq.cache import log_counts
from transformer_vq.ops.vq.kernels import BlockDocuments, block_prefixes, block_starts, prepend_previous_block
from transformer_vq.ops.vq.state import VQAttentionState
from transformer_vq.ops.vq.triton.function import FusedVQAttention

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""What the kernels compute in (``tl.dot`` takes no float64)."""


def attend_blocks_fused(q, k_hat, z, v, codebook, bias, L, state: VQAttentionState, reduction, code_scores=None,
                        compressive_cache=True, doc_start=None):
    """Queries of ``N`` whole blocks starting at a block boundary, with the arguments of ``attend_blocks``.

    ``code_scores`` must be ``None`` (the kernels compute the codeword scores themselves) and ``compressive_cache``
    true (:func:`check_fused_inputs`). ``doc_start``: packed documents, as in the eager kernel: the segmented prefix
    over blocks stays in torch, and the kernels mask the window and the cache by the document ids.
    """
    S, N = codebook.shape[1], z.shape[2] // L
    k_all, v_all, z_prev, prev_len = prepend_previous_block(k_hat, z, v, L, state)
    if 0 < prev_len < L:
        raise ValueError(f"backend='triton' takes a state whose previous block is whole or absent, got {prev_len} of "
                         f"its {L} keys (a state begun inside a block): use backend='eager'")
    has_prev = prev_len == L
    starts = block_starts(z, L, state, doc_start)  # (B, (N + 1) L)
    docs = None if doc_start is None else BlockDocuments(starts, N, L)
    prefix_count, prefix_mean = block_prefixes(z_prev, v_all, S, L, state, reduction, prev_len, docs)
    log_count = log_counts(prefix_count[:, :, :-1], torch.float32)  # (B, G, N, S): counts carry no gradient
    ids = (None, None) if docs is None else (docs.segment, docs.cache_segment)
    out = FusedVQAttention.apply(q, k_all, v_all, bias, codebook, log_count, prefix_mean[:, :, :-1], L, has_prev, *ids)
    # copies, as the eager kernel makes them: slices would keep every block's prefixes and the call's keys alive
    # beside the state, and a view of the caller's z would change with it
    return out, VQAttentionState(state.offset + z.shape[2], prefix_count[:, :, -1].clone(),
                                 prefix_mean[:, :, -1].clone(), k_all[:, :, -L:].clone(), v_all[:, :, -L:].clone(),
                                 z[:, :, -L:].clone(), starts[:, -L:].clone(), L, documents=doc_start is not None)


def check_fused_inputs(q: torch.Tensor, code_scores, compressive_cache: bool) -> None:
    """Raise ``ValueError`` for what the fused kernels do not take."""
    if not compressive_cache:
        raise ValueError("backend='triton' attends the per-code cache: compressive_cache=False needs backend='eager'")
    if code_scores is not None:
        raise ValueError("backend='triton' computes the codeword scores itself: code_scores needs backend='eager'")
    if q.dtype not in DTYPES:
        raise ValueError(f"backend='triton' computes in float32, float16 or bfloat16, got {q.dtype}")
