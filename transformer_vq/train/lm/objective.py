"""What a training window teaches: the next token (causal models) or the masked tokens (encoders).

A causal model predicts every next token of its window, its attention state carried from window to window. An
encoder (``causal=False``) sees its whole window at once, so the next token would be in its input: it is trained
instead by masked-token prediction (BERT's objective, Devlin et al. 2019, in its plain form): a fraction
``mask_rate`` of the window's positions is replaced by the mask token (``cfg.mask_token_id``, one past the
vocabulary), and the loss is the cross-entropy of the original tokens at those positions. Every masked position
becomes the mask token (no random or kept replacements), so training and evaluation read the same kind of input.

The mask of a window is drawn from a generator seeded by (run seed, step, worker), not from the global random
state, so a resumed run masks exactly as an uninterrupted one and evaluation masks the same way every time.
"""

from __future__ import annotations

import torch

# Mixes the step and the worker into the seed of a window's mask (any large odd constants would do).
_STEP_STRIDE, _RANK_STRIDE = 1_000_003, 7_919


def mask_generator(seed: int, step: int = 0, rank: int = 0) -> torch.Generator:
    """The CPU generator that draws the mask of one window."""
    return torch.Generator().manual_seed(seed * _STEP_STRIDE * _RANK_STRIDE + step * _RANK_STRIDE + rank)


def mask_tokens(tokens: torch.Tensor, *, mask_rate: float, mask_token_id: int, generator: torch.Generator,
                real: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, masked)``: ``tokens`` ``[B, T]`` with a random ``mask_rate`` of positions set to the mask token,
    and the ``[B, T]`` bool of those positions.

    Every row with a real token gets at least one masked position, so every row has a loss. ``real`` (``[B, T]``
    bool) keeps padding out of the draw.
    """
    if not 0.0 < mask_rate < 1.0:
        raise ValueError(f"mask_rate must lie strictly between 0 and 1, got {mask_rate}")
    draws = torch.rand(tokens.shape, generator=generator).to(tokens.device)
    if real is not None:
        draws = draws.masked_fill(~real, 2.0)  # never below the rate, never the row's minimum
    masked = draws < mask_rate
    first = draws.argmin(dim=-1, keepdim=True)  # the row's lowest draw: masked whatever the rate
    row_has_real = torch.ones_like(first, dtype=torch.bool) if real is None else real.any(dim=-1, keepdim=True)
    masked = masked.scatter(-1, first, row_has_real) | masked
    return tokens.masked_fill(masked, mask_token_id), masked


def masked_window(inputs: torch.Tensor, *, cfg, seed: int, step: int, rank: int):
    """``(inputs, targets, loss_mask)`` of an encoder's training window: corrupted inputs, the original tokens as
    targets, and the masked positions as the positions that count."""
    corrupted, masked = mask_tokens(inputs, mask_rate=cfg.mask_rate, mask_token_id=cfg.mask_token_id,
                                    generator=mask_generator(seed, step, rank))
    return corrupted, inputs, masked
