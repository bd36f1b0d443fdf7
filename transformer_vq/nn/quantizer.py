"""The vector quantizer of the keys, with a codebook learned by EMA k-means (Sec. 2.3-2.4, 3.4).

Tensor letters: B batch, G key groups (one codebook each), T positions, S codewords, D width.

Life cycle of the codebook in training (the order matters):

1. ``forward`` quantizes with the *current* codebook (the one any carried attention cache was built
   with) and, in training mode, adds the window's per-code key sums and counts to accumulators.
   Nothing else changes, and no collective runs inside ``forward``.
2. In data-parallel training, ``stats()`` lists the accumulators; all-reduce them (SUM) once.
3. After the optimizer step, ``update()`` applies one EMA step from the accumulated statistics
   (``gamma`` = ``ema_rate``) and clears them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import nn

from transformer_vq.config.fields import is_integer
from transformer_vq.nn.inputs import as_mask
from transformer_vq.nn.outputs import module_output
from transformer_vq.ops.protocol import check_positive_int
from transformer_vq.nn.token_mean import token_mean


@module_output
@dataclass
class QuantizerOutput:
    """What :class:`VectorQuantizer` returns for a batch of keys: the quantized keys, their codes and the
    commitment loss."""

    k_hat: torch.Tensor
    """``[B, G, T, D]`` quantized keys: ``codebook[z]`` in value, identity Jacobian w.r.t. the keys."""
    z: torch.Tensor
    """``[B, G, T]`` int64 shortcodes."""
    commit_loss: torch.Tensor
    """Scalar: mean over (unmasked) positions of ``||k - sg(c_z)||^2`` summed over groups (Eq. 37)."""
    codebook: torch.Tensor
    """``[G, S, D]`` the codebook used, without gradient."""


class VectorQuantizer(nn.Module):
    """Nearest-codeword quantizer with straight-through gradients and an EMA k-means codebook.

    Args:
        n_group: number of independent codebooks ``G`` (one per key/value group).
        n_code: codewords per codebook ``S``.
        dim: codeword width ``D``.
        ema_rate: ``gamma`` of the EMA (0.99 in the paper).
        dead_code_restart: re-seed a code from recent keys after it went unused for this many
            consecutive updates (0 = never, the paper's setting).
        init_scale: standard deviation of the initial codewords' entries.
    """

    def __init__(self, n_group: int, n_code: int, dim: int, *, ema_rate: float = 0.99,
                 dead_code_restart: int = 0, init_scale: float = 1.0):
        super().__init__()
        for name, value in (("n_group", n_group), ("n_code", n_code), ("dim", dim)):
            check_positive_int(value, name)
        if not is_integer(dead_code_restart) or dead_code_restart < 0:
            raise ValueError(f"dead_code_restart must be an integer >= 0 (0 = never), got {dead_code_restart!r}")
        if not 0.0 < ema_rate < 1.0:  # at 1 the codebook never moves; above it, the EMA diverges (as the configs)
            raise ValueError(f"ema_rate must be in (0, 1), got {ema_rate!r}")
        if not init_scale > 0.0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        # kept as Python numbers, whatever integer or real type was given (a numpy or 0-d torch value is neither
        # JSON-serialisable nor a plain size)
        n_group, n_code, dim = operator.index(n_group), operator.index(n_code), operator.index(dim)
        self.n_group, self.n_code, self.dim = n_group, n_code, dim
        self.ema_rate = float(ema_rate)
        self.dead_code_restart = operator.index(dead_code_restart)
        # EMA of per-code key sums and counts; the codeword is sum / count. Counts start at one so the
        # initial codewords are the initial sums.
        self.register_buffer("ema_sum", torch.randn(n_group, n_code, dim) * init_scale)
        self.register_buffer("ema_count", torch.ones(n_group, n_code))
        self.register_buffer("updates_unused", torch.zeros(n_group, n_code))
        # Statistics of the current update window (not saved: they are empty between steps).
        self.register_buffer("acc_sum", torch.zeros(n_group, n_code, dim), persistent=False)
        self.register_buffer("acc_count", torch.zeros(n_group, n_code), persistent=False)
        self.register_buffer("acc_recent", torch.zeros(n_group, n_code, dim), persistent=False)
        self.register_buffer("acc_recent_n", torch.zeros(n_group, n_code), persistent=False)  # keys per slot
        self.register_buffer("last_count", torch.zeros(n_group, n_code), persistent=False)

    @property
    def codebook(self) -> torch.Tensor:
        """``[G, S, D]``: EMA sum / EMA count, the count floored at 0.01 so dead codes stay finite."""
        return self.ema_sum / self.ema_count.clamp(min=0.01).unsqueeze(-1)

    def forward(self, k: torch.Tensor, mask: torch.Tensor | None = None) -> QuantizerOutput:
        """Quantize ``k`` of shape ``[B, G, T, D]``; ``mask`` ``[B, T]`` (True = real token) excludes
        padded positions from the commitment loss and from the codebook statistics."""
        if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[1] != self.n_group or k.shape[3] != self.dim \
                or not k.dtype.is_floating_point:
            got = f"{tuple(k.shape)} {k.dtype}" if isinstance(k, torch.Tensor) else type(k).__name__
            raise ValueError(f"k must be a floating [B, G, T, D] = [B, {self.n_group}, T, {self.dim}] tensor, "
                             f"got {got}")
        B, G, T, D = k.shape
        mask = as_mask(mask, (B, T), "mask", of="k's [B, T]")
        codebook = self.codebook.detach()
        with torch.no_grad():
            z = self.shortcodes(k)
        k_hat_value = codebook[torch.arange(G, device=k.device)[None, :, None], z]  # (B, G, T, D)
        k_hat = k + (k_hat_value.to(k.dtype) - k).detach()  # straight-through estimator (Def. 2.6)

        wide = torch.promote_types(k.dtype, torch.float32)  # float32 at least: bf16 under autocast, float64 kept
        sq_dist = (k.to(wide) - k_hat_value.to(wide)).pow(2).sum(dim=-1).sum(dim=1)  # (B, T), summed over groups
        commit_loss = token_mean(sq_dist, mask)

        if self.training:
            weights = torch.ones(B, T, dtype=torch.float32, device=k.device) if mask is None else mask.float()
            self._accumulate(k.detach(), z, weights)
        return QuantizerOutput(k_hat=k_hat, z=z, commit_loss=commit_loss, codebook=codebook)

    @torch.no_grad()
    def shortcodes(self, k: torch.Tensor) -> torch.Tensor:
        """``argmin_s ||k - C_s||^2`` per position, computed in float32 whatever the input dtype."""
        codebook = self.codebook.float()  # (G, S, D)
        k = k.float()
        # ||k - c||^2 = ||k||^2 - 2 k.c + ||c||^2; the first term does not change the argmin. One fused product per
        # group, ||c||^2 - 2 k.c: a single [B T, S] tensor (apart, the product and the difference were two).
        B, G, T, D = k.shape
        dist = torch.baddbmm(codebook.pow(2).sum(-1).unsqueeze(1), k.transpose(0, 1).reshape(G, B * T, D),
                             codebook.transpose(-1, -2), alpha=-2)  # (G, B T, S)
        return dist.argmin(dim=-1).view(G, B, T).transpose(0, 1).contiguous()  # (B, G, T)

    @torch.no_grad()
    def _accumulate(self, k: torch.Tensor, z: torch.Tensor, weights: torch.Tensor) -> None:
        B, G, T, D = k.shape
        w = weights[:, None, :].expand(B, G, T).to(self.acc_count.dtype)  # (B, G, T)
        index = z.permute(1, 0, 2).reshape(G, B * T)  # (G, B*T)
        w_flat = w.permute(1, 0, 2).reshape(G, B * T)
        keys = k.to(self.acc_sum.dtype).permute(1, 0, 2, 3).reshape(G, B * T, D) * w_flat.unsqueeze(-1)
        self.acc_count.scatter_add_(1, index, w_flat)
        self.acc_sum.scatter_add_(1, index.unsqueeze(-1).expand(G, B * T, D), keys)
        if self.dead_code_restart:
            # Keep S keys drawn from this window's real positions, to re-seed dead codes with.
            real = w_flat[0].nonzero().squeeze(-1)
            if real.numel():
                pick = real[torch.randint(real.numel(), (self.n_code,), device=k.device)]
                self.acc_recent.copy_(keys[:, pick])
                self.acc_recent_n.fill_(1.0)

    def stats(self, rank: int = 0, world_size: int = 1) -> list[torch.Tensor]:
        """The accumulated statistics, to all-reduce (SUM) across the ``world_size`` data-parallel (and context-
        parallel) workers before ``update``; ``rank`` is this worker's. Each worker keeps its recent keys only in the
        slots it owns (slot ``c`` on worker ``c mod world_size``), so that after the sum every slot holds one real key:
        summed and divided by the worker count, a dead code was re-seeded with the mean of unrelated keys, and codes
        restarted at once bunched at the mean key, the more the more workers."""
        if world_size > 1:
            mine = (torch.arange(self.n_code, device=self.acc_recent.device) % world_size == rank).to(
                self.acc_recent.dtype)
            self.acc_recent.mul_(mine[None, :, None])
            self.acc_recent_n.mul_(mine[None, :])
        return [self.acc_sum, self.acc_count, self.acc_recent, self.acc_recent_n]

    @torch.no_grad()
    def update(self) -> None:
        """One EMA k-means step from the accumulated statistics, then clear them.

        ``ema_count <- gamma ema_count + (1 - gamma) count`` and likewise for the sums, so a code that
        received no keys keeps its codeword while its count decays geometrically, until the count reaches the
        0.01 floor of :attr:`codebook` (``ln 0.01 / ln gamma`` idle updates: 459 at gamma 0.99); from then on
        the sum alone decays and the codeword shrinks towards the origin by ``gamma`` per update, as in the
        authors' code (``c_sum / clip(c_count, 0.01)``); a ``dead_code_restart`` below that re-seeds the code first.
        """
        gamma = self.ema_rate
        self.ema_count.mul_(gamma).add_(self.acc_count, alpha=1 - gamma)
        self.ema_sum.mul_(gamma).add_(self.acc_sum, alpha=1 - gamma)
        self.last_count.copy_(self.acc_count)
        unused = self.acc_count == 0
        self.updates_unused.add_(1).mul_(unused)
        if self.dead_code_restart:
            self._restart_dead_codes()
        self.reset_stats()

    @torch.no_grad()
    def _restart_dead_codes(self) -> None:
        dead = self.updates_unused >= self.dead_code_restart  # (G, S)
        have_keys = self.acc_recent_n > 0  # (G, S): the slot's worker drew a key
        dead = dead & have_keys
        if dead.any():
            # one key per slot, the one its worker drew (stats); the division is a no-op kept for a sum of several
            recent = self.acc_recent / self.acc_recent_n.clamp(min=1.0).unsqueeze(-1)
            self.ema_sum[dead] = recent[dead]
            self.ema_count[dead] = 1.0
            self.updates_unused[dead] = 0

    @torch.no_grad()
    def reset_stats(self) -> None:
        """Discard the accumulated statistics (after an update, or for a skipped step)."""
        for t in self.stats():
            t.zero_()

    @torch.no_grad()
    def metrics(self) -> dict[str, float]:
        """Code usage over the last update window: perplexity of the usage distribution (``S`` when
        uniform, 1 when one code takes everything) and the fraction of codes that got no key."""
        counts = self.last_count
        total = counts.sum(-1, keepdim=True)
        if float(total.sum()) == 0:
            return {"codebook_perplexity": float("nan"), "codebook_unused": float("nan")}
        p = counts / total.clamp(min=1e-12)
        entropy = -(p * p.clamp(min=1e-12).log()).sum(-1)  # (G,)
        return {
            "codebook_perplexity": float(entropy.exp().mean()),
            "codebook_unused": float((counts == 0).float().mean()),
        }

    def extra_repr(self) -> str:
        return f"groups={self.n_group}, codes={self.n_code}, dim={self.dim}, ema_rate={self.ema_rate}"
