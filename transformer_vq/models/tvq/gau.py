"""The gated attention unit (Definition 3.1, Remark 3.2, App. C), with VQ attention or a baseline core.

Tensor letters: B batch, T positions, Dm model width, H query heads, G key/value groups,
Dk key width per head, Dvh value width per head (H * Dvh = Dv), L block length.

    x~ = RMSNorm(x)                                   (no parameters, eps 1e-6)
    q  = Dk^-1/4 RMSNorm(x~ W_q)    k = Dk^-1/4 RMSNorm(x~ W_k)   (per head; unit gain, zero bias)
    v  = SiLU(x~ W_v)               k^ = STVQ(k; C)
    a  = Attn(q, k^, v)             g = SiLU(x~ W_g)
    o  = a * g                      y = x + Dropout(o W_o)

``Attn`` is the kernel of ``cfg.attn_type`` from :data:`transformer_vq.ops.KERNELS`, all called the same way
(docs/operator.md); the baselines take the unquantized ``k``.

With both q and k scaled by ``Dk^-1/4`` and RMS-normalized, ``q . k = sqrt(Dk) cos(q, k)``: the paper's
``tau`` (Eq. 8-9, ``Q = tau^-0.5 LN(...)``) is ``sqrt(Dk)``, the authors' code's choice.

Positions: a Transformer-XL relative bias over the two-block window. The sinusoid table of distances
``0 .. span`` (max wavelength 1e5, with dropout ``dropsin``) is projected to ``R_d`` (scaled by
``Dk^-1/4``); with learned ``u`` and ``v_r`` (zero-initialized), content scores use ``(q + u) . k^`` for
every key and the bias of query t to window column j is ``(q_t + v_r) . R_d`` with ``d`` the distance
between them, zero beyond ``span``. ``cfg.bias_span`` sets it: ``"window"`` (the default) covers the whole
two-block window (``span = 2L - 1``), the natural reading of "relative bias over the two-block window";
``"block"`` stops at ``span = L``, as the authors' code does (a key further back in the window still takes
part, without the bias). docs/operator.md, "The bias span".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from transformer_vq.config import TransformerVQConfig
from transformer_vq.nn.attend import attend, shifted_codebook
from transformer_vq.nn.held import HeldValue
from transformer_vq.nn.inputs import as_mask, check_features
from transformer_vq.nn.norm import rms_norm
from transformer_vq.nn.outputs import module_output
from transformer_vq.nn.position import sinusoids
from transformer_vq.nn.quantizer import VectorQuantizer
from transformer_vq.ops.vq_qk import code_pair_table


@module_output
@dataclass
class GAUOutput:
    """What one gated attention unit returns: the residual stream, its state and its commitment loss."""

    x: torch.Tensor
    """``[B, T, Dm]`` the residual stream after this unit."""
    state: Any
    """The attention state to pass to the next call on the same sequences (``None`` for quadratic mode)."""
    commit_loss: torch.Tensor
    """Scalar commitment loss of this unit's quantizer (0 for unquantized baselines)."""


def _silu(h: torch.Tensor) -> torch.Tensor:
    """SiLU of a fresh projection ``h``, in place where no graph is recorded. With autograd it is not: the backward
    needs ``h``, which an in-place SiLU would make autograd copy first."""
    return F.silu(h, inplace=not h.requires_grad)


def chunk_start(group, length: int) -> int:
    """Position of this rank's chunk in a sequence split into chunks of ``length`` tokens over the ranks of ``group``
    in rank order (0 without a group). Chunks of other lengths (whole blocks each) start elsewhere but at the same
    place within a block, all a unit's window bias reads; a model's absolute positions and state offset read the
    lengths the ranks agreed (:mod:`transformer_vq.models.tvq.chunks`)."""
    return 0 if group is None else dist.get_rank(group) * length


class GatedAttentionUnit(nn.Module):
    """One gated attention unit with its residual connection, for any ``cfg.attn_type`` / ``cfg.head_type``."""

    def __init__(self, cfg: TransformerVQConfig):
        super().__init__()
        self.cfg = cfg
        H, G, Dk, Dm = cfg.n_head, cfg.n_kv_head, cfg.d_k, cfg.d_model
        self.n_head, self.n_group, self.d_k, self.d_v_head = H, G, Dk, cfg.d_v_head
        self.w_q = nn.Linear(Dm, H * Dk, bias=False)
        self.w_k = nn.Linear(Dm, G * Dk, bias=False)
        self.w_v = nn.Linear(Dm, G * cfg.d_v_head, bias=False)
        self.w_g = nn.Linear(Dm, cfg.d_v, bias=False)
        self.w_o = nn.Linear(cfg.d_v, Dm, bias=False)
        self.w_r = nn.Linear(Dm, H * Dk, bias=False)
        self.u = nn.Parameter(torch.zeros(H, Dk))
        self.v_r = nn.Parameter(torch.zeros(H, Dk))
        self.quantizer = self.query_quantizer = self.cache_bias = None
        if cfg.cache_bias_init is not None:
            # one logit per head on the keys older than the window (docs/quality.md, "A learned bias on the cache")
            self.cache_bias = nn.Parameter(torch.empty(H))
        if cfg.attn_type == "vq":
            # codewords start at the scale of the keys (and queries), whose entries are ~Dk^-1/4
            self.quantizer = VectorQuantizer(G, cfg.n_code, Dk, ema_rate=cfg.ema_rate,
                                             dead_code_restart=cfg.dead_code_restart, init_scale=Dk ** -0.25)
        if cfg.quantize_queries:
            self.query_quantizer = VectorQuantizer(H, cfg.n_code, Dk, ema_rate=cfg.ema_rate,
                                                   dead_code_restart=cfg.dead_code_restart, init_scale=Dk ** -0.25)
        # derived from the weights alone, held outside training between calls (decoding calls once per token)
        self._held_relative_table = HeldValue()
        self._held_code_pairs = HeldValue()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 1/fan_in) projections (App. C follows Chowdhery et al.); zero u, v_r; the cache bias at
        ``cache_bias_init``."""
        for linear in (self.w_q, self.w_k, self.w_v, self.w_g, self.w_o, self.w_r):
            nn.init.normal_(linear.weight, std=linear.in_features ** -0.5)
        nn.init.zeros_(self.u)
        nn.init.zeros_(self.v_r)
        if self.cache_bias is not None:
            nn.init.constant_(self.cache_bias, self.cfg.cache_bias_init)

    def forward(self, x: torch.Tensor, *, state=None, mask: torch.Tensor | None = None,
                attention: str = "linear", context_parallel=None,
                doc_start: torch.Tensor | None = None) -> GAUOutput:
        """Apply the unit to ``x`` ``[B, T, Dm]``.

        Args:
            state: the previous call's state for the same sequences, or ``None`` at their start.
            mask: ``[B, T]`` True for real tokens; padded keys never update the codebook.
            attention: ``"linear"`` (the kernel of ``cfg.attn_type``, any ``state``) or ``"quadratic"`` (the
                dense formula of VQ attention, whole sequences only; VQ attention only).
            context_parallel: the process group over whose ranks the sequences are split along time; ``x`` is this
                rank's chunk (the chunks of equal length, in rank order) and ``state`` the state at the start of the
                whole sequences; the returned state is the one at their end (docs/distributed.md).
            doc_start: ``[B, T]`` bool, True where a packed document begins: nothing is attended across it.
        """
        cfg = self.cfg
        check_features(x, cfg.d_model, "x")
        B, T, _ = x.shape
        mask = as_mask(mask, (B, T), "mask", of="x's [B, T]")
        H, G, Dk, Dvh = self.n_head, self.n_group, self.d_k, self.d_v_head
        scale = Dk ** -0.25
        offset = (0 if state is None else state.offset) + chunk_start(context_parallel, T)

        x_tilde = rms_norm(x)
        q = rms_norm(self.w_q(x_tilde).view(B, T, H, Dk)).transpose(1, 2) * scale  # (B, H, T, Dk)
        k = rms_norm(self.w_k(x_tilde).view(B, T, G, Dk)).transpose(1, 2) * scale  # (B, G, T, Dk)
        v = _silu(self.w_v(x_tilde)).view(B, T, G, Dvh).transpose(1, 2)  # (B, G, T, Dvh)

        commit_loss = x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32))
        keys = queries = None
        if self.quantizer is not None:
            keys = self.quantizer(k, mask)
            commit_loss = commit_loss + keys.commit_loss
            k = keys.k_hat
        if self.query_quantizer is not None:
            queries = self.query_quantizer(q, mask)
            commit_loss = commit_loss + queries.commit_loss
            q = queries.k_hat  # every score of the unit, the position bias's too, is then a function of q_hat
        bias = self._window_bias(q, offset)  # (B, H, T, 2L) causal, (B, H, T, 3L) non-causal
        shift = self.u * scale  # (H, Dk) Transformer-XL's content bias
        out, state = attend(cfg, q + shift[None, :, None, :], k, v, bias, state=state, mask=mask, attention=attention,
                            keys=keys, queries=queries, query_shift=shift, table=self._held_code_table(queries, shift),
                            context_parallel=context_parallel, doc_start=doc_start, cache_bias=self.cache_bias)

        # The gate is made after the attention, so that it is not held through the attention's peak, and the
        # attention's inputs are let go first (without autograd nothing else holds them: 0.3 GiB at 32k tokens).
        del q, k, v, bias, keys, queries
        gate = _silu(self.w_g(x_tilde))  # (B, T, Dv)
        out = out.transpose(1, 2).reshape(B, T, H * Dvh)  # (B, T, Dv)
        out = out * gate if gate.requires_grad or out.requires_grad else gate.mul_(out)
        branch = F.dropout(self.w_o(out), p=cfg.dropres, training=self.training)
        if self.training and cfg.droplyr > 0:
            # LayerDrop per sequence, rescaled like dropout so inference needs no correction. The unit
            # is still computed so that its attention state stays a function of the whole input.
            keep = (torch.rand(B, 1, 1, device=x.device) >= cfg.droplyr).to(branch.dtype)
            if context_parallel is not None:  # one decision per sequence, its first chunk's, on every rank of it
                dist.broadcast(keep, src=dist.get_global_rank(context_parallel, 0), group=context_parallel)
            branch = branch * keep / (1 - cfg.droplyr)
        return GAUOutput(x=x + branch, state=state, commit_loss=commit_loss)

    def _held_code_table(self, queries, shift: torch.Tensor) -> torch.Tensor | None:
        """The code-pair table of quantized queries, held between calls outside training (``None`` in training, or
        without quantized queries: the operator builds it). Decoding calls the unit once per token; rebuilding the
        ``H x S x S x Dk`` table each time would cost more than the token's attention."""
        if queries is None or self.training or torch.is_grad_enabled():
            return None
        quantizers = (self.quantizer, self.query_quantizer)

        def build():
            codebook_q = shifted_codebook(queries, shift)
            return code_pair_table(codebook_q, self.quantizer.codebook.to(codebook_q.dtype))

        sources = [t for quantizer in quantizers for t in (quantizer.ema_sum, quantizer.ema_count)] + [self.u]
        return self._held_code_pairs.get(sources, key=queries.codebook.dtype, build=build)

    def _span(self) -> int:
        """The largest distance the position bias covers: ``2L - 1`` for ``bias_span`` "window" (every key of the
        two-block window), ``L`` for "block" (the authors' code)."""
        L = self.cfg.block_len
        return L if self.cfg.bias_span == "block" else 2 * L - 1

    def _distances(self) -> torch.Tensor:
        """The query-minus-key distances the position bias covers: ``0 .. span`` for a causal unit (its two-block
        window holds no future key), ``-span .. span`` for an encoder (its three-block window)."""
        span = self._span()
        first = 0 if self.cfg.causal else -span
        return torch.arange(first, span + 1, device=self.w_r.weight.device)

    def _relative_table(self, dtype: torch.dtype) -> torch.Tensor:
        """``[H, P, Dk]``: ``R_d`` for the ``P`` distances of :meth:`_distances`, scaled by ``Dk^-1/4``.

        Outside training (no sinusoid dropout) the table is held while ``W_r`` holds the same values
        (:class:`~transformer_vq.nn.held.HeldValue`), so decoding does not re-project it at every token.
        """
        H, Dk = self.n_head, self.d_k

        def build():
            distances = self._distances()
            table = sinusoids(distances, self.cfg.d_model, self.cfg.max_wavelength, self.w_r.weight.dtype)
            table = F.dropout(table, p=self.cfg.dropsin, training=self.training)
            return (self.w_r(table).view(len(distances), H, Dk).transpose(0, 1) * Dk ** -0.25).to(dtype)  # (H, P, Dk)

        if self.training or torch.is_grad_enabled():
            return build()
        return self._held_relative_table.get([self.w_r.weight], key=dtype, build=build)

    def _window_bias(self, q: torch.Tensor, offset: int) -> torch.Tensor:
        """``[B, H, T, W]``: bias of query t (absolute position offset + t) to window column j.

        A causal unit's window is two blocks (``W = 2L``: the previous and the current one); an encoder's is three
        (``W = 3L``: the previous, the current and the next). Column ``j`` is the key at position
        ``(tau // L - 1) L + j`` for the query at position ``tau``, so its distance is ``tau % L + L - j``.

        The distance depends on the query only through its place in its block, so one ``(L, W)`` index, laid over the
        rows block by block, reads every row's columns from the ``P`` distances' scores: a ``(T, W)`` index (and the
        masks beside it) would cost 3-4 times the bias itself, and autograd would keep one for the backward. Columns
        with no bias (beyond the span; a later key of a causal unit, which the operator masks) read an extra
        distance whose table row is zero, so their score is an exact zero and no mask is needed.
        """
        B, H, T, Dk = q.shape
        L = self.cfg.block_len
        rel = self._relative_table(q.dtype)  # (H, P, Dk)
        rel = torch.cat([rel, rel.new_zeros(H, 1, Dk)], dim=1)  # (H, P + 1, Dk): the last row is "no bias"
        by_distance = (q + self.v_r[None, :, None, :] * Dk ** -0.25) @ rel.transpose(-1, -2)[None]  # (B, H, T, P + 1)
        index = self._column_index(offset % L, q.device)  # (L, W)
        W, whole = index.shape[1], T // L * L
        pieces = []
        if whole:  # rows t and t + L share their place in the block: blocks of rows, one index for all
            blocks = by_distance[:, :, :whole].view(B, H, T // L, L, -1)  # (B, H, N, L, P + 1)
            pieces.append(blocks.gather(-1, index.expand(B, H, T // L, L, W)).view(B, H, whole, W))
        if T > whole:
            pieces.append(by_distance[:, :, whole:].gather(-1, index[:T - whole].expand(B, H, T - whole, W)))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)

    def _column_index(self, phase: int, device) -> torch.Tensor:
        """``(L, W)`` int64: for the ``i``-th row of a block of rows whose first query sits at place ``phase`` of its
        block, the column of the ``P + 1`` distance scores window column ``j`` reads (``P``, the zero row, outside
        the span)."""
        L = self.cfg.block_len
        n_columns = 2 * L if self.cfg.causal else 3 * L
        place = (torch.arange(L, device=device) + phase) % L  # place of each row's query in its block
        distance = place[:, None] + L - torch.arange(n_columns, device=device)[None, :]  # (L, W); negative: later
        span = self._span()
        first = 0 if self.cfg.causal else -span
        outside = (distance < first) | (distance > span)
        return torch.where(outside, span - first + 1, distance - first)
