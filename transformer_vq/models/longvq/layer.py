"""The LongVQ layer and block (Liu et al. 2024, eqs. 9-22); the choices the paper leaves open are in docs/longvq.md.

Tensor letters: B batch, T positions, D model width, Dqk query/key width, Dv value width, L block length.

    Z   = SiLU(SSM(X))                                         (eq. 9; SSM: transformer_vq.models.longvq.ssm)
    G_a = SiLU(Z W_g)     Q = Dqk^-1/4 RMSNorm(Z W_q)     K = Dqk^-1/4 RMSNorm(Z W_k)        (eqs. 10-12)
    V   = SiLU(X W_v)                                                                       (eq. 13)
    K^  = STVQ(K; C)                                                                        (eq. 15)
    O_a = (G_a * phi(Q K^T + B) V) W_o                                        (eqs. 14, 16-18)
    G_o = sigmoid(X W_go)        O = G_o * O_a + (1 - G_o) * X                              (eqs. 19-20)
    Y   = Norm(O)                Y' = Norm(Y + FFN(Y))                                      (eqs. 21-22)

``phi`` is softmax or ``relu^2`` (normalized by the number of real keys), computed in linear time by the library's
operators: :func:`~transformer_vq.ops.vq_bidir.vq_bidir_attention` for an encoder (every real key, a local bias over
the query's own and the two neighbouring blocks), :func:`~transformer_vq.ops.vq.vq_attention` for a causal layer
(softmax over every past key, a bias over the current and the previous block, a state carried between calls).
``attention="quadratic"`` takes the dense formula of the same attention and the naive SSM instead.

The local bias ``B`` is a learned scalar per query-key distance (zero at initialization): ``2L`` distances for a
causal layer, ``4L - 1`` for an encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_vq.config import LongVQConfig
from transformer_vq.models.longvq.ssm import DampedEMA, EMAState
from transformer_vq.nn.attend import ATTENTION_MODES
from transformer_vq.nn.inputs import as_mask, check_features
from transformer_vq.nn.norm import rms_norm
from transformer_vq.nn.outputs import module_output
from transformer_vq.nn.quantizer import VectorQuantizer
from transformer_vq.ops import vq_attention, vq_attention_naive
from transformer_vq.ops.vq.state import VQAttentionState
from transformer_vq.ops.vq_bidir import vq_bidir_attention, vq_bidir_attention_naive


@dataclass
class LongVQLayerState:
    """What a causal LongVQ layer carries between calls: the SSM's EMA and the VQ attention state (both bounded)."""

    ssm: EMAState
    attn: VQAttentionState

    @property
    def offset(self) -> int:
        """Number of tokens consumed so far."""
        return self.attn.offset

    def detach(self) -> "LongVQLayerState":
        """A copy cut from the autograd graph (truncated backprop between training windows)."""
        return LongVQLayerState(self.ssm.detach(), self.attn.detach())

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        return self.ssm.nbytes() + self.attn.nbytes()


@module_output
@dataclass
class LongVQLayerOutput:
    """What one LongVQ layer (or block) returns: its output, its state and its commitment loss."""

    x: torch.Tensor
    """``[B, T, D]`` the layer's (or block's) output."""
    state: LongVQLayerState | None
    """The state to continue these sequences with (``None`` for an encoder or the dense reference)."""
    commit_loss: torch.Tensor
    """Scalar commitment loss of the layer's quantizer (eq. 24)."""


class SequenceNorm(nn.Module):
    """One of the normalizations of Table 7 over the channels of ``[B, T, D]``.

    ``"layer"``: LayerNorm. ``"scale"``: ScaleNorm, ``g x / ||x||`` with one learned ``g`` (initialized to
    ``sqrt(D)``). ``"batch"``: BatchNorm over the real tokens of the batch only (padding neither enters the statistics
    nor is normalized; it comes out zero).
    """

    def __init__(self, kind: str, dim: int):
        super().__init__()
        self.kind = kind
        if kind == "layer":
            self.norm = nn.LayerNorm(dim)
        elif kind == "batch":
            self.norm = nn.BatchNorm1d(dim)
        elif kind == "scale":
            self.gain = nn.Parameter(torch.tensor(float(dim) ** 0.5))
        else:
            raise ValueError(f"norm must be one of layer, batch, scale, got {kind!r}")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize ``x [B, T, D]``; ``mask [B, T]`` (True: real) matters to batch norm only."""
        if self.kind == "layer":
            return self.norm(x)
        if self.kind == "scale":
            return x * (self.gain / x.norm(dim=-1, keepdim=True).clamp(min=1e-5))
        if mask is None or bool(mask.all()):  # no padding: every token is a sample, without the indexing
            return self._batch_norm(x.reshape(-1, x.shape[-1])).view_as(x)
        out = x.new_zeros(x.shape)
        out[mask] = self._batch_norm(x[mask])  # (real tokens, D)
        return out

    def _batch_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        """Batch norm of ``tokens [N, D]``; refused by name where training has one token to take statistics of (the
        count is the shape: no read)."""
        if self.training and tokens.shape[0] < 2:
            raise ValueError(f"norm 'batch' takes the statistics of the batch's real tokens in training, and this "
                             f"call has {tokens.shape[0]}; give batches of two real tokens or more, or use norm "
                             f"'layer' or 'scale'")
        return self.norm(tokens)


class LongVQLayer(nn.Module):
    """The gated SSM-VQ-attention layer of eqs. 9-20 (its own gated residual, no other)."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.cfg = cfg
        D, Dqk, Dv, L = cfg.d_model, cfg.d_qk, cfg.d_v, cfg.block_len
        self.ssm = DampedEMA(D, cfg.ema_dim, bidirectional=not cfg.causal, timescale=cfg.ema_timescale)
        self.w_z = nn.Linear(D, 2 * Dqk + Dv)  # Q, K and G_a from Z (eqs. 10-12)
        self.w_x = nn.Linear(D, Dv + D)  # V and G_o from X (eqs. 13, 19)
        self.w_o = nn.Linear(Dv, D)
        # one bias per query-minus-key distance of the window: 0 .. 2L-1 (causal), -(2L-1) .. 2L-1 (encoder)
        self.first_distance = 0 if cfg.causal else 1 - 2 * L
        self.local_bias = nn.Parameter(torch.zeros(2 * L - self.first_distance))
        # codewords start at the scale of the normalized keys, whose entries are ~Dqk^-1/4
        self.quantizer = VectorQuantizer(1, cfg.n_code, Dqk, ema_rate=cfg.ema_rate,
                                         dead_code_restart=cfg.dead_code_restart, init_scale=Dqk ** -0.25)

    def forward(self, x: torch.Tensor, *, state: LongVQLayerState | None = None, mask: torch.Tensor | None = None,
                attention: str = "linear") -> LongVQLayerOutput:
        """Apply the layer to ``x [B, T, D]``.

        Args:
            state: the previous call's state for the same sequences (causal layers), ``None`` at their start.
            mask: ``[B, T]`` True (or nonzero, an integer 0/1 mask) for real tokens: padding enters neither the SSM
                (zeroed) nor attention nor the codebook statistics. A causal layer takes trailing padding only (it
                never reaches earlier tokens).
            attention: ``"linear"`` (the operators, the FFT SSM) or ``"quadratic"`` (dense attention, naive SSM).
        """
        cfg = self.cfg
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
        if attention == "quadratic" and state is not None:
            raise ValueError("attention='quadratic' runs the dense reference on whole sequences: pass state=None")
        check_features(x, cfg.d_model, "x")
        B, T, _ = x.shape
        mask = as_mask(mask, (B, T), "mask", of="x's [B, T]")  # bool; an integer 0/1 mask as a tokenizer's
        Dqk, Dv = cfg.d_qk, cfg.d_v
        if mask is not None and not bool(mask.all()):
            x = x.masked_fill(~mask[..., None], 0.0)  # padding adds nothing to any convolution
        ssm_out, ssm_state = self.ssm(x, None if state is None else state.ssm, naive=attention == "quadratic")
        z = F.silu(ssm_out)  # (B, T, D) eq. 9
        q, k, gate_a = self.w_z(z).split([Dqk, Dqk, Dv], dim=-1)
        q = rms_norm(q)[:, None] * Dqk ** -0.25  # (B, 1, T, Dqk): one head
        k = rms_norm(k)[:, None] * Dqk ** -0.25
        v, gate_o = self.w_x(x).split([Dv, cfg.d_model], dim=-1)
        v = F.silu(v)[:, None]  # (B, 1, T, Dv)

        keys = self.quantizer(k, mask)
        offset = 0 if state is None else state.offset
        bias = self.window_bias(T, offset).to(q.dtype).expand(B, 1, -1, -1)  # (B, 1, T, W)
        out, attn_state = self._attend(q, keys, v, bias, None if state is None else state.attn, mask, attention)
        o_a = self.w_o(out[:, 0] * F.silu(gate_a))  # (B, T, D) eq. 14
        o_a = F.dropout(o_a, p=cfg.dropout, training=self.training)
        gate_o = torch.sigmoid(gate_o)
        new_state = None if attn_state is None else LongVQLayerState(ssm_state, attn_state)
        return LongVQLayerOutput(x=gate_o * o_a + (1 - gate_o) * x, state=new_state, commit_loss=keys.commit_loss)

    def _attend(self, q, keys, v, bias, attn_state, mask, attention):
        """``(out [B, 1, T, Dv], state)`` from the library's operators (or their dense formulas)."""
        cfg, L = self.cfg, self.cfg.block_len
        if not cfg.causal:
            if attention == "quadratic":
                return vq_bidir_attention_naive(q, keys.k_hat, v, bias, block_len=L, mask=mask,
                                                scoring=cfg.scoring), None
            return vq_bidir_attention(q, keys.k_hat, v, bias, block_len=L, z=keys.z, codebook=keys.codebook,
                                      mask=mask, scoring=cfg.scoring)
        if attention == "quadratic":
            return vq_attention_naive(q, keys.k_hat, v, bias, block_len=L), None
        return vq_attention(q, keys.k_hat, v, bias, block_len=L, state=attn_state, z=keys.z, codebook=keys.codebook)

    def window_bias(self, length: int, offset: int) -> torch.Tensor:
        """``[T, W]``: the learned bias of each query (absolute position ``offset + t``) to window column ``j``.

        Column ``j`` is the key at ``(tau // L - 1) L + j`` for the query at ``tau``, so their distance is
        ``tau % L + L - j``; ``W = 2L`` (causal: later columns are masked by the operator and get 0) or ``3L``.
        """
        L = self.cfg.block_len
        columns = torch.arange((2 if self.cfg.causal else 3) * L, device=self.local_bias.device)
        # A row depends on its query's place in the block only: one [rows, W] table, gathered from the biases and
        # then tiled over the blocks. The gather's backward (an accumulating scatter, serial on a CPU) then sees
        # rows W entries, not T W; the tiling's backward is a sum over blocks. Only the call's own phases are built
        # (rows = min(L, T)): a decoding step (T = 1) or a block longer than the sequence costs O(T W), not O(L W).
        rows = min(L, length)
        phase = (torch.arange(rows, device=columns.device) + offset) % L  # row r: the query at offset + r (mod L)
        distance = phase[:, None] + L - columns[None, :]  # (rows, W)
        index = (distance - self.first_distance).clamp(0, self.local_bias.numel() - 1)
        table = self.local_bias[index].masked_fill(distance < self.first_distance, 0.0)  # (rows, W)
        return table.repeat(-(-length // L), 1)[:length]  # (T, W): row t is table[t mod L] (rows = L when T > L)


class LongVQBlock(nn.Module):
    """A LongVQ block (eqs. 21-22): the layer, a norm, a position-wise FFN with its residual, a norm."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.cfg = cfg
        self.layer = LongVQLayer(cfg)
        self.norm_attn = SequenceNorm(cfg.norm, cfg.d_model)
        self.ffn_in = nn.Linear(cfg.d_model, cfg.d_ffn)
        self.ffn_out = nn.Linear(cfg.d_ffn, cfg.d_model)
        self.norm_ffn = SequenceNorm(cfg.norm, cfg.d_model)

    def forward(self, x: torch.Tensor, *, state: LongVQLayerState | None = None, mask: torch.Tensor | None = None,
                attention: str = "linear") -> LongVQLayerOutput:
        """Apply the block to ``x [B, T, D]`` (arguments as :meth:`LongVQLayer.forward`)."""
        check_features(x, self.cfg.d_model, "x")
        mask = as_mask(mask, x.shape[:2], "mask", of="x's [B, T]")  # the norms take it too
        out = self.layer(x, state=state, mask=mask, attention=attention)
        y = self.norm_attn(out.x, mask)  # eq. 21: the layer's gated residual replaces the usual one
        hidden = F.dropout(F.silu(self.ffn_in(y)), p=self.cfg.dropout, training=self.training)
        ffn = F.dropout(self.ffn_out(hidden), p=self.cfg.dropout, training=self.training)
        return LongVQLayerOutput(x=self.norm_ffn(y + ffn, mask), state=out.state, commit_loss=out.commit_loss)
