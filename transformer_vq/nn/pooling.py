"""What every sequence classifier of the library shares: mean pooling over real tokens, a linear head, the loss
(docs/longvq.md, "Classifiers"; the codebook interface is :mod:`transformer_vq.nn.codebooks`, the input checks
:mod:`transformer_vq.nn.inputs`).

Letters: B batch, T positions, D width, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_vq.nn.outputs import module_output


@module_output
@dataclass
class ClassifierOutput:
    """What a sequence classifier's call returns: the class logits, and the losses when labels are given."""

    logits: torch.Tensor
    """``[B, C]`` class logits."""
    commit_loss: torch.Tensor
    """Scalar: commitment loss summed over the model's quantizers (0 without any), before the coefficient."""
    ce_loss: torch.Tensor | None = None
    """Mean cross-entropy in nats over the batch, when labels are given."""
    loss: torch.Tensor | None = None
    """``ce_loss + commit_coef * commit_loss`` (LongVQ's eq. 23), when labels are given."""


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, D]``: the mean of ``x [B, T, D]`` over the real tokens (``mask [B, T]`` True; ``None``: all)."""
    if mask is None:
        return x.mean(dim=1)
    weights = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
    return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class PoolingHead(nn.Module):
    """Mean pooling over the real tokens, then a linear classifier; with labels, the loss of eq. 23."""

    def __init__(self, dim: int, n_classes: int, commit_coef: float):
        super().__init__()
        if n_classes < 1:
            raise ValueError(f"a classifier needs n_classes >= 1, got {n_classes} (n_classes 0 is a language model: "
                             f"LongVQLM)")
        self.linear = nn.Linear(dim, n_classes)
        self.commit_coef = commit_coef

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, commit_loss: torch.Tensor,
                labels: torch.Tensor | None = None) -> ClassifierOutput:
        """``x [B, T, D]`` features, ``labels [B]`` int64 class ids (optional)."""
        logits = self.linear(masked_mean(x, mask))  # (B, C)
        result = ClassifierOutput(logits=logits, commit_loss=commit_loss)
        if labels is not None:
            n_classes = logits.shape[-1]
            if labels.shape != logits.shape[:1] or labels.dtype != torch.long:
                raise ValueError(f"labels must be a [batch] int64 tensor, got {tuple(labels.shape)} {labels.dtype}")
            if int(labels.min()) < 0 or int(labels.max()) >= n_classes:
                raise ValueError(f"labels must be class ids in [0, {n_classes})")
            result.ce_loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)
            result.loss = result.ce_loss + self.commit_coef * commit_loss
        return result
