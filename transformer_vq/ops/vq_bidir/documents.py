"""Packed documents in non-causal VQ attention: each document attends only its own keys, on both sides.

A document is a contiguous run of a row, so of the keys a query of block ``n`` sees through their code (those outside
its window of blocks ``n - h .. n + h``, ``h = 1`` with the local bias, ``h = 0`` without) its document can hold only
two runs: the keys just before the window and the keys just after it. Per query block the operator keeps

* the *left* summary: the keys of blocks ``< n - h`` of the document of the key just before the window, a prefix over
  blocks that restarts at every block holding a start (the segmented scan of the causal cache,
  :func:`transformer_vq.ops.vq.cache.prefix_serial` with ``keep``);
* the *right* summary: the keys of blocks ``> n + h`` of the document of the key just after the window, the same scan
  over the reversed row (where the last token of each document begins one);

and a query takes each only when it belongs to that document (a comparison of document ids, no per-query summary).
The window keys are masked to the query's document. Two summaries of at most ``N x S x Dv`` each: memory stays linear
in ``T`` whatever the number of documents.

Letters: B batch, G key/value groups, T positions (whole blocks: ``T = N L``), N blocks, L block length, S codewords,
Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.documents import segment_ids
from transformer_vq.ops.vq.cache import prefix_serial
from transformer_vq.ops.vq_bidir.summary import masked_summary


class RowDocuments:
    """Where the documents of a padded row ``[B, N L]`` fall, for a window of ``h`` blocks on each side.

    * ``segment (B, T)``: document id of each position;
    * ``left``, ``right``: ``(count (B, G, N, S), mean (B, G, N, S, Dv))`` per query block, the summaries above;
    * ``left_open``, ``right_open`` ``(B, N, L)``: whether each query belongs to the document of that summary;
    * ``n_keys (B, T)``: the number of keys of the document of each position that count (real ones), at least 1.
    """

    def __init__(self, z: torch.Tensor, v: torch.Tensor, real: torch.Tensor, doc_start: torch.Tensor, n_code: int,
                 block_len: int, reach: int):
        B, G, T = z.shape
        L, N, h = block_len, T // block_len, reach
        self.block_len, self.reach = L, h
        self.segment = segment_ids(doc_start)  # (B, T)
        # A document without a real key has only padding queries (zeroed by the caller): its keys count as real, so
        # that no score set is empty (the rule of a fully padded sequence, applied per document).
        real = real | (_per_document(real, self.segment) == 0)
        self.real, self.n_keys = real, _per_document(real, self.segment).clamp(min=1)
        block = torch.arange(N, device=z.device)
        ends = torch.cat([doc_start[:, 1:], torch.ones_like(doc_start[:, :1])], dim=1)  # the last token of each doc
        left_count, left_mean = _segmented_prefix(z, v, real, doc_start, n_code, L)
        right_count, right_mean = _segmented_prefix(z.flip(-1), v.flip(-2), real.flip(-1), ends.flip(-1), n_code, L)
        before = (block - h).clamp(min=0)  # prefix index i: blocks < i
        after = (N - 1 - block - h).clamp(min=0)  # over the reversed blocks: blocks > n + h
        self.left = left_count[:, :, before], left_mean[:, :, before]
        self.right = right_count[:, :, after], right_mean[:, :, after]
        query = self.segment.view(B, N, L)
        # The key just before the window and the one just after it (clamped where there is none: the summary is
        # then empty, whatever the comparison says).
        self.left_open = query == self.segment[:, ((block - h) * L - 1).clamp(min=0)][..., None]
        self.right_open = query == self.segment[:, ((block + h + 1) * L).clamp(max=T - 1)][..., None]

    def window_hidden(self) -> torch.Tensor:
        """``(B, N, L, W)``, ``W = (2 h + 1) L``: True where a window key is padding or of another document than the
        query; the window of block ``n`` starts at block ``n - h``, as the unfolded keys are laid out."""
        B, T = self.segment.shape
        L, pad = self.block_len, self.reach * self.block_len
        width = 2 * pad + L
        segment = F.pad(self.segment, (pad, pad), value=-1).unfold(1, width, L)  # (B, N, W): -1 outside the row
        real = F.pad(self.real, (pad, pad), value=False).unfold(1, width, L)  # (B, N, W)
        other = segment[:, :, None, :] != self.segment.view(B, -1, L)[..., None]  # (B, N, L, W)
        return other | ~real[:, :, None, :]


def _per_document(count: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """``(B, T)``: the sum of ``count (B, T)`` (bool) over the document of each position."""
    B, T = segment.shape
    totals = torch.zeros(B, T + 1, dtype=torch.long, device=segment.device)
    totals.scatter_add_(1, segment, count.to(torch.long))
    return totals.gather(1, segment)


def _segmented_prefix(z, v, real, doc_start, n_code, L):
    """``(B, G, N + 1, S)``, ``(B, G, N + 1, S, Dv)``: index ``i``, the real keys of blocks ``< i`` of the document of
    the key at ``i L - 1`` (empty for ``i = 0``)."""
    B, G, T = z.shape
    N, Dv = T // L, v.shape[-1]
    segment = segment_ids(doc_start).view(B, N, L)
    after_last_start = (segment == segment[..., -1:]) & real.view(B, N, L)  # the keys later blocks may see
    counts, means = masked_summary(z.view(B, G, N, L), v.view(B, G, N, L, Dv), after_last_start, n_code)
    keep = ~doc_start.view(B, N, L).any(dim=-1)  # (B, N): the running summary restarts at a block holding a start
    return prefix_serial(torch.zeros_like(counts[:, :, 0]), torch.zeros_like(means[:, :, 0]), counts, means, keep)
