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
from transformer_vq.ops.vq.kernels import Normalize, softmax_combine
from transformer_vq.ops.vq_bidir.window_product import add_window_product, window_product

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
    # relu2 runs in float32 at least, as the softmax does; each weight is divided by n before any product, so that
    # no partial sum exceeds the output's bound (relu^2 c[s] alone overflows float16 at a few thousand keys)
    acc = torch.promote_types(code_scores.dtype, torch.float32)
    n = n_real.to(acc)
    weights = F.relu(code_scores.to(acc)).square()
    out = sum((weights * (count.to(acc) / n)).to(mean.dtype) @ mean for count, mean in summaries)
    if window is not None:
        scores, values = window
        out = out + (F.relu(scores.to(acc)).square() / n).to(values.dtype) @ values  # relu(-inf) = 0: padding keys
    return out


def combine_corrected(scoring: str, scores: list[torch.Tensor], count: torch.Tensor, mean: torch.Tensor,
                      v_blocks: torch.Tensor, n_real: torch.Tensor, scratch: bool = False) -> torch.Tensor:
    """Attention output ``[B, G, N, R, L, Dv]``: every real key through its code, the window's keys corrected.

    A key ``p`` seen through its code weighs ``w(q . C[z_p])``; in the query's window it should weigh ``w(q . k_hat_p
    + beta)`` (the same ``q . C[z_p]`` in value, plus the bias). So the whole sequence is read through one summary
    (``count, mean`` of every real key per code) and the window adds, key by key, the difference of the two weights:
    no per-block summaries (``N S Dv`` numbers, several times the values themselves), and the window's product is the
    one it always was. The difference is negative where the bias is: the sum then cancels in part, by at most a factor
    ``e^-beta`` of the removed weight (docs/operator.md, "Non-causal VQ attention").

    Args:
        scores: ``[code_scores, window_scores, key_code_scores]``, emptied here so that each is freed once used (the
            caller keeps no reference): ``code_scores [B, G, N, R, L, S]`` ``q . C[s]``; ``window_scores [B, G, N,
            R, L, 3L]`` ``q . k_hat + beta`` of the window's keys (``-inf`` where a key is padding or outside the
            sequence); ``key_code_scores``: the same keys' ``q . C[z_p]`` (``-inf`` at the same places).
        count, mean: ``[B, G, S]``, ``[B, G, S, Dv]``, the summary of every real key.
        v_blocks: ``[B, G, N, L, Dv]`` the values in blocks (window column ``j`` of block ``n`` is key ``j`` of the
            blocks ``n - 1 .. n + 1``).
        n_real: broadcasts over ``[B, G, N, R, L, 1]``, the number of real keys (the ``relu2`` normalizer).
        scratch: ``code_scores`` may be overwritten (the caller made them for this call): without autograd the log
            counts are added in place.
    """
    B, G, N, R, L, S = scores[0].shape
    tracked = torch.is_grad_enabled() and any(x.requires_grad for x in (*scores, mean, v_blocks))
    if scoring == "softmax":
        w_code, w_window, denominator = _softmax_weights(scores, count, tracked, scratch)
    else:
        w_code, w_window = _relu2_weights(scores, count, n_real)
        denominator = None  # the weights are divided by n already
    # The window's three blocks read from the value blocks in place; the codes, one (N R L, S) x (S, Dv) product
    # per group (the summary shared by every query block), are added to them in the same call: in place without
    # autograd. Both paths take the same steps in the same order, so they agree bit for bit.
    w_code, w_window = w_code.to(mean.dtype).reshape(B * G, N * R * L, S), w_window.flatten(3, 4)
    if not tracked and v_blocks.dtype == mean.dtype:
        window = add_window_product(w_window.new_zeros(B, G, N, R * L, v_blocks.shape[-1]), w_window, v_blocks)
        numerator = window.view(B * G, N * R * L, -1).baddbmm_(w_code, mean.reshape(B * G, S, -1))
    else:
        window = window_product(w_window, v_blocks).to(mean.dtype)  # (B, G, N, R L, Dv)
        numerator = torch.baddbmm(window.view(B * G, N * R * L, -1), w_code, mean.reshape(B * G, S, -1))
    numerator = numerator.view(B, G, N, R, L, -1)
    if denominator is None:
        return numerator
    denominator = denominator.to(numerator.dtype)
    return numerator.div_(denominator) if not tracked else Normalize.apply(numerator, denominator)


def _softmax_weights(scores: list[torch.Tensor], count: torch.Tensor, tracked: bool, scratch: bool):
    """``(w_code, w_window, denominator)`` of :func:`combine_corrected`'s softmax: ``exp(q . C[s] + log c[s] - m)``,
    ``exp(window score - m) - exp(key code score - m)`` and their row sum, one shift ``m`` for both (a key's code score
    never exceeds its code's entry, ``log c >= 0``). Empties ``scores``; each score tensor is dropped once its weights
    exist (``exp`` keeps its output, not its input). Without autograd the fresh scores become the weights in place."""
    code_scores, window_scores, key_code_scores = scores
    scores.clear()
    acc = torch.promote_types(code_scores.dtype, torch.float32)
    window_scores, key_code_scores = window_scores.to(acc), key_code_scores.to(acc)
    logits = log_counts(count, acc)[:, :, None, None, None, :]  # -inf: unused codes
    # in place only without autograd: on a view of the product under autograd, the backward copies it whole
    in_place = scratch and not tracked and code_scores.dtype == acc
    s_code = code_scores.add_(logits) if in_place else code_scores.to(acc) + logits
    del code_scores
    # the shift is a constant: its gradient is stopped
    shift = torch.maximum(s_code.detach().amax(dim=-1), window_scores.detach().amax(dim=-1)).unsqueeze(-1)
    if tracked:
        w_code = torch.exp(s_code - shift)
        del s_code
        w_window = torch.exp(window_scores - shift)
        del window_scores
        w_window = w_window - torch.exp(key_code_scores - shift)
    else:
        w_code = s_code.sub_(shift).exp_()
        w_window = window_scores.sub_(shift).exp_().sub_(key_code_scores.sub_(shift).exp_())
    return w_code, w_window, w_code.sum(dim=-1, keepdim=True) + w_window.sum(dim=-1, keepdim=True)


def _relu2_weights(scores: list[torch.Tensor], count: torch.Tensor, n_real: torch.Tensor):
    """``(w_code, w_window)`` of :func:`combine_corrected`'s ``relu2``: ``relu(q . C[s])^2 c[s] / n`` and
    ``(relu(window score)^2 - relu(key code score)^2) / n`` (``relu(-inf) = 0``: padding), in at least float32,
    divided by the number of real keys before any product (:func:`combine`). Empties ``scores``."""
    code_scores, window_scores, key_code_scores = scores
    scores.clear()
    acc = torch.promote_types(code_scores.dtype, torch.float32)
    n = n_real.to(acc)
    w_code = F.relu(code_scores.to(acc)).square() * (count[:, :, None, None, None, :].to(acc) / n)
    del code_scores
    return w_code, (F.relu(window_scores.to(acc)).square() - F.relu(key_code_scores.to(acc)).square()) / n
