"""What a training window teaches: the next token (causal models) or the masked tokens (encoders).

A causal model predicts every next token of its window, its attention state carried from window to window. An
encoder (``causal=False``) sees its whole window at once, so the next token would be in its input: it is trained
instead by masked-token prediction (BERT's objective, Devlin et al. 2019, in its plain form): a fraction
``mask_rate`` of the window's positions is replaced by the mask token (``cfg.mask_token_id``, one past the
vocabulary), and the loss is the cross-entropy of the original tokens at those positions. Every masked position
becomes the mask token (no random or kept replacements), so training and evaluation read the same kind of input.

The mask of a row is drawn from a generator seeded by (run seed, step, the row's index in the global batch), not from
the global random state nor by worker, so a resumed run masks exactly as an uninterrupted one, evaluation masks the
same way every time, and any number of data-parallel workers masks the global batch as one process does.

Each row masks the same number of positions, ``round(mask_rate * T)`` (at least one), not a count that varies by
chance: each worker's loss is the mean over its own masked positions and DDP / FSDP average those means, which equals
one process's mean over the global batch only when every worker holds as many masked positions.
"""

from __future__ import annotations

import torch

# Mixes the step and the row into the seed of a row's mask (any large odd constants would do; rows of a global batch
# past the row stride share a seed with a row of the next step, a repeat of a mask, harmless).
_STEP_STRIDE, _ROW_STRIDE = 1_000_003, 7_919


def mask_generator(seed: int, step: int = 0, row: int = 0) -> torch.Generator:
    """The CPU generator that draws the mask of one row: ``row`` of the global batch at ``step`` (training), or
    window ``step`` of a split (evaluation)."""
    return torch.Generator().manual_seed(seed * _STEP_STRIDE * _ROW_STRIDE + step * _ROW_STRIDE + row)


def mask_tokens(tokens: torch.Tensor, *, mask_rate: float, mask_token_id: int, generator: torch.Generator,
                real: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, masked)``: ``tokens`` ``[B, T]`` with ``round(mask_rate * n)`` random positions of each row set to
    the mask token (``n`` its real tokens, at least one position where it has any), and the ``[B, T]`` bool of
    those positions.

    A fixed count, not a draw per position: rows of equal length mask equally many positions, so the mean loss over
    the masked positions of any share of a batch weighs every row as the whole batch's does. ``real`` (``[B, T]``
    bool) keeps padding out of the draw.
    """
    if not 0.0 < mask_rate < 1.0:
        raise ValueError(f"mask_rate must lie strictly between 0 and 1, got {mask_rate}")
    draws = torch.rand(tokens.shape, generator=generator)
    n_real = torch.full(tokens.shape[:-1], tokens.shape[-1]) if real is None else real.cpu().sum(dim=-1)
    if real is not None:
        draws = draws.masked_fill(~real.cpu(), 2.0)  # padding draws last, never among a row's lowest real ones
    count = (n_real * mask_rate).round().clamp(min=1).minimum(n_real)  # (B,): no position in a row without tokens
    # the `count` lowest draws of each row; ranks from a stable sort, so tied draws still mask exactly `count`
    order = draws.argsort(dim=-1, stable=True).argsort(dim=-1, stable=True)
    masked = (order < count.unsqueeze(-1)).to(tokens.device)
    return tokens.masked_fill(masked, mask_token_id), masked


def masked_window(inputs: torch.Tensor, *, cfg, seed: int, step: int, first_row: int):
    """``(inputs, targets, loss_mask)`` of an encoder's training window: corrupted inputs, the original tokens as
    targets, and the masked positions as the positions that count.

    ``inputs`` are rows ``first_row, first_row + 1, ...`` of the global batch (a worker's contiguous share, see
    data/batches); each row is masked by its own generator, so the workers' masks together are one process's."""
    pairs = [mask_tokens(inputs[i:i + 1], mask_rate=cfg.mask_rate, mask_token_id=cfg.mask_token_id,
                         generator=mask_generator(seed, step, first_row + i)) for i in range(inputs.shape[0])]
    return torch.cat([p[0] for p in pairs]), inputs, torch.cat([p[1] for p in pairs])
