"""The two scorings of non-causal VQ attention, each over codewords (with per-code summaries) and window keys.

* ``"softmax"`` (Theorem 3.5): code ``s`` enters the softmax with score ``q . C[s] + log c[s]`` and value ``m[s]``,
  exactly what its ``c[s]`` keys would contribute one by one (``transformer_vq.ops.vq.kernels.softmax_combine``).
* ``"relu2"`` (Theorem 3.4 with the element-wise ``relu^2`` of LongVQ / FLASH): key ``p`` gets the weight
  ``relu(s)^2 / n`` with ``n`` the number of real keys of the sequence, so code ``s`` adds
  ``relu(q . C[s])^2 c[s] m[s] / n``. Dividing by ``n`` makes the output a mean over keys, bounded whatever the length
  (docs/operator.md, "Non-causal VQ attention").

Letters: t queries, S codewords, W window keys, Dv value width; ``...`` leading dimensions shared by all arguments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_vq.ops.vq.cache import log_counts
from transformer_vq.ops.vq.kernels import softmax_combine

SCORINGS = ("softmax", "relu2")
"""The nonlinearities ``phi_w`` the non-causal operator computes exactly."""


def combine(scoring: str, code_scores: torch.Tensor, summaries: list[tuple[torch.Tensor, torch.Tensor]],
            window: tuple[torch.Tensor, torch.Tensor] | None, n_real: torch.Tensor) -> torch.Tensor:
    """Attention output ``[..., t, Dv]`` from codewords and, optionally, window keys.

    Args:
        scoring: one of :data:`SCORINGS`.
        code_scores: ``[..., t, S]`` scores ``q . C[s]`` of each query against each codeword.
        summaries: ``(count, mean)`` pairs of disjoint sets of keys seen through the codebook: ``count [..., 1 or t,
            S]`` keys of each code (0 where a query does not see them), ``mean [..., S, Dv]`` their mean value.
        window: ``(scores [..., t, W], values [..., W, Dv])`` of the keys scored exactly, ``-inf`` where a key is
            padding; or ``None``.
        n_real: ``[..., 1 or t, 1]`` number of real keys each query attends (>= 1), the ``relu2`` normalizer.
    """
    if scoring == "softmax":
        parts = [(code_scores + log_counts(count, code_scores.dtype), mean) for count, mean in summaries]
        parts = parts if window is None else [*parts, window]
        # Without autograd the (fresh) score tensors are scratch space, overwritten by their weights in place.
        tracked = torch.is_grad_enabled() and any(x.requires_grad for part in parts for x in part)
        return softmax_combine(parts, in_place=not tracked)
    # relu2 runs in float32 at least, as the softmax does.
    acc = torch.promote_types(code_scores.dtype, torch.float32)
    weights = F.relu(code_scores.to(acc)).square()
    out = sum((weights * count.to(acc)).to(mean.dtype) @ mean for count, mean in summaries)
    if window is not None:
        scores, values = window
        out = out + F.relu(scores.to(acc)).square().to(values.dtype) @ values  # relu(-inf) = 0: padding keys
    return out / n_real.to(out.dtype)
