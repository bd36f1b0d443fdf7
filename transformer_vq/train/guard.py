"""The guards of a training step, applied by the engine (trainer.py) for every task:
a step whose loss, gradient or learning rate is not finite is skipped; a step that made the weights non-finite,
or too many skipped steps in a row, stop the training with a :class:`TrainingError` saying what to do."""

from __future__ import annotations

import math


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what to do."""


def skip_reason(finite_loss: bool, grad_norm: float, lrs: list[float]) -> str | None:
    """Why a step must be skipped (its weights, optimizer and codebooks left untouched), or None to apply it."""
    if not finite_loss or not math.isfinite(grad_norm):
        return "loss or gradient"
    if not all(math.isfinite(lr) for lr in lrs):
        return f"learning rate (lr={lrs[0]})"  # AdamW would turn every weight into NaN
    return None


def nonfinite_weights_error(step: int, bad: list[str], lr: float) -> TrainingError:
    """The error of step ``step`` (1-based) whose update made the weights ``bad`` non-finite."""
    return TrainingError(
        f"step {step} made the weights non-finite ({', '.join(bad[:3])}) although its loss and "
        f"gradient were finite: the learning rate {lr:g} is too large. Nothing after the last checkpoint "
        f"was saved; lower the learning rate and start again or resume with --resume auto"
    )


def too_many_skipped_error(step: int, run: int, reason: str | None, max_nonfinite: int) -> TrainingError:
    """The error of a training stopped after ``run`` skipped steps in a row (its state saved by the caller)."""
    return TrainingError(
        f"stopped at step {step}: {run} steps in a row had a non-finite "
        f"{reason} (max_nonfinite={max_nonfinite}); the weights are those of the last "
        f"good step (saved). Lower the learning rate (--set lr=...), use precision=float32, "
        f"or check the data"
    )
