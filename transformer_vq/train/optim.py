"""Optimizers and the learning-rate schedule of the paper (App. C.2).

- AdamW: beta1 0.9, beta2 0.98, eps 1e-9, max lr 4e-4, global gradient clip 0.1.
- Adafactor: relative step sizes, update clip 1.0, max lr 0.01, beta1 0 (no momentum),
  beta2_t = 1 - t^-0.8. ``torch.optim.Adafactor`` implements exactly this form: its step size is
  ``min(lr, 1/sqrt(t)) * max(eps2, RMS(param))`` (relative), its update is clipped by ``d = 1``,
  it keeps no first moment, and ``beta2_decay = -0.8`` gives ``beta2_t = 1 - t^-0.8``.
- Weight decay only on parameters with more than one dimension (not on gains or biases).
- Linear warmup to the peak, then cosine decay to ``final_lr_ratio`` times the peak (the paper: 10x).
"""

from __future__ import annotations

import math

import torch

from transformer_vq.config import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups: matrices with weight decay, vectors and scalars without."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``'s parameters, at the peak learning rate."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=(0.9, 0.98), eps=1e-9)
    if cfg.optimizer == "adafactor":
        return torch.optim.Adafactor(groups, lr=cfg.peak_lr, beta2_decay=-0.8, d=1.0)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, final_ratio: float) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Rises linearly over ``warmup_steps`` (reaching 1 at the last warmup step), then follows half a
    cosine from 1 down to ``final_ratio`` at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_note(*, warmup_steps: int, total_steps: int) -> str | None:
    """A warning when the run ends inside its warmup (its learning rate never reaches the peak and never decays),
    else None. Not refused: a short smoke run at the default warmup is a fair thing to ask for."""
    if warmup_steps < total_steps:
        return None
    reached = lr_factor(total_steps - 1, warmup_steps=warmup_steps, total_steps=total_steps, final_ratio=1.0)
    return (f"warning: warmup_steps {warmup_steps} >= steps {total_steps}: the run ends in its warmup, the learning "
            f"rate rises to {reached:.0%} of its peak and never decays; pass --warmup-steps below --steps for the "
            f"cosine schedule")


def stretched_schedule_note(saved_steps, cfg: TrainConfig, step: int) -> str | None:
    """A note when a resume changes ``steps``, the cosine's horizon (else None): the schedule is recomputed over the
    new total, so the learning rate of the next step moves, up when a decayed run is trained longer, without a new
    warmup (the authors' launcher trained extra steps at the final rate instead); the user hears it here, not from
    the loss."""
    if not isinstance(saved_steps, int) or saved_steps == cfg.steps:
        return None

    def lr(total: int) -> float:
        return cfg.peak_lr * lr_factor(step, warmup_steps=cfg.warmup_steps, total_steps=total,
                                       final_ratio=cfg.final_lr_ratio)

    head = f"note: steps {saved_steps} -> {cfg.steps}: the warmup-cosine schedule is recomputed over {cfg.steps} steps"
    now, planned = lr(cfg.steps), lr(saved_steps)
    if f"{now:.3g}" == f"{planned:.3g}":  # the next step's rate is the same: say when the change begins, if ever
        if step >= cfg.warmup_steps or cfg.final_lr_ratio == 1:
            return None  # no cosine left to move (or a flat one)
        return (f"{head}: the learning rate is the same through the warmup (to step {cfg.warmup_steps}), then "
                f"decays over the new total")
    plan = "had" if step < saved_steps else "ended at"  # past its last step, the old plan stays at its final rate
    return f"{head}, so the learning rate at step {step + 1} is {now:.3g} where the run's plan {plan} {planned:.3g} " \
           f"(no new warmup)"


def apply_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                   cfg: TrainConfig) -> None:
    """Set ``cfg``'s peak learning rate and weight decay (a resumed run's, its flags on top of the saved ones) at the
    point of the schedule ``scheduler`` has reached (restored from a checkpoint): a lowered lr takes effect now."""
    peak, groups = cfg.peak_lr, optimizer.param_groups
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    for group, weight_decay in zip(groups, (cfg.weight_decay, 0.0)):  # build_optimizer's groups, in their order
        group.update(weight_decay=weight_decay, initial_lr=peak, lr=peak * factor)
    scheduler.base_lrs = [peak] * len(groups)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() reports until the next step


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + cosine schedule; call ``scheduler.step()`` once per optimizer step (skipped ones too)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps,
                               final_ratio=cfg.final_lr_ratio),
    )
