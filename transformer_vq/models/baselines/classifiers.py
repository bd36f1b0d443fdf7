"""The two classifiers LongVQ is compared with, built from the same :class:`LongVQConfig` (same vocabulary, width
``d_model``, depth ``n_layers``, classes, pooling head): docs/longvq.md, "Classifiers".

* :class:`TransformerClassifier`: a pre-norm Transformer encoder with full softmax attention over every real token
  (PyTorch's fused ``scaled_dot_product_attention``, quadratic in time, the fair baseline a user would write; its
  oracle is :func:`~transformer_vq.ops.full.bidir.full_bidir_attention`), heads of width ``d_qk``, a GELU FFN of
  width ``d_ffn`` and sinusoid absolute positions (LRA's Transformer).
* :class:`TransformerVQEncoderClassifier`: the library's :class:`~transformer_vq.models.tvq.model.TransformerVQ` with
  ``causal=False`` (``n_layers`` layers of two gated attention units, ``d_k = d_qk``, ``d_v``, the same codebook
  size and block length), its units' output pooled.

Letters: B batch, T positions, D width, H heads, Dh head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_vq.config import ConfigError, LongVQConfig, TransformerVQConfig
from transformer_vq.models.tvq.model import TransformerVQ
from transformer_vq.nn.codebooks import Codebooks
from transformer_vq.nn.inputs import as_mask, check_token_ids
from transformer_vq.nn.pooling import ClassifierOutput, PoolingHead
from transformer_vq.nn.position import sinusoids
from transformer_vq.ops.full.bidir import full_bidir_attention


def key_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, H, T, Dh]``: softmax attention of every query over every real key (``mask [B, T]``, True: real), zero at
    padding queries, by PyTorch's fused kernel (no ``[T, T]`` scores kept where the kernel can avoid them).

    Its oracle is :func:`~transformer_vq.ops.full.bidir.full_bidir_attention` (tested in float64, outputs and gradients,
    a sequence of padding only included: the kernel gives its all-hidden rows zero, and they are zeroed anyway).
    """
    if mask is None or bool(mask.all()):  # nothing to hide: the kernel's unmasked path
        return F.scaled_dot_product_attention(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])  # keys: (B, 1, 1, T)
    return out.masked_fill(~mask[:, None, :, None], 0.0)


def dense_key_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               mask: torch.Tensor | None) -> torch.Tensor:
    """:func:`key_masked_attention` with its ``[B, H, T, T]`` scores and weights built whole, as the "vanilla
    Transformer" of LongVQ's and Mega's speed tables does (LongVQ's Table 2: "5.3x faster, 10% of the memory" at 4k):
    a benchmark baseline (``tvq bench longvq``'s ``transformer-dense``), not a model choice. It is the oracle itself,
    on queries scaled as the fused kernel scales them (one window of the whole sequence: no local bias)."""
    return full_bidir_attention(q * q.shape[-1] ** -0.5, k, v, block_len=q.shape[-2], mask=mask)[0]


class TransformerEncoderLayer(nn.Module):
    """``x + Attn(LN(x))``, then ``x + FFN(LN(x))``: multi-head softmax attention over every real token, by
    ``attend`` (the fused kernel; :func:`dense_key_masked_attention` for the materialized baseline of speed tables)."""

    def __init__(self, cfg: LongVQConfig, attend=key_masked_attention):
        super().__init__()
        self.cfg, self.n_head, self.attend = cfg, cfg.d_model // cfg.d_qk, attend
        self.norm_attn, self.norm_ffn = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.w_qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.w_o = nn.Linear(cfg.d_model, cfg.d_model)
        self.ffn_in, self.ffn_out = nn.Linear(cfg.d_model, cfg.d_ffn), nn.Linear(cfg.d_ffn, cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``[B, T, D]`` -> ``[B, T, D]``."""
        B, T, D = x.shape
        H, p = self.n_head, self.cfg.dropout
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in self.w_qkv(self.norm_attn(x)).chunk(3, dim=-1))
        out = self.attend(q, k, v, mask)
        x = x + F.dropout(self.w_o(out.transpose(1, 2).reshape(B, T, D)), p=p, training=self.training)
        hidden = F.dropout(F.gelu(self.ffn_in(self.norm_ffn(x))), p=p, training=self.training)
        return x + F.dropout(self.ffn_out(hidden), p=p, training=self.training)


def check_baseline_config(cfg: LongVQConfig, name: str, norm: str) -> None:
    """Refuse (``ValueError``) a config whose fields would build another model than it says: the baselines are
    encoders, of softmax attention and ``norm`` norms; ``causal``, ``scoring`` and ``norm`` would otherwise be ignored
    (``tvq classify train`` refuses them as flags; this is the same refusal from Python)."""
    if cfg.causal:
        raise ValueError(f"the {name} baseline is an encoder: build it from a config with causal=False (got "
                         f"causal=True, LongVQConfig's default, a language model's)")
    for field, value, kept in (("scoring", cfg.scoring, "softmax"), ("norm", cfg.norm, "layer")):
        if value != kept:
            does = "softmax attention" if field == "scoring" else f"{norm} norms"
            raise ValueError(f"the {name} baseline has {does}, and the config asks for {field}={value!r}; leave "
                             f"{field} at {kept!r} (it configures LongVQ only)")


class TransformerClassifier(Codebooks, nn.Module):
    """The quadratic baseline: ``model(ids, mask=..., labels=...)`` -> :class:`ClassifierOutput` (no codebooks)."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.head = PoolingHead(cfg.d_model, cfg.n_classes, cfg.commit_coef)  # n_classes first: a LM config
        check_baseline_config(cfg, "Transformer", "layer")
        if cfg.d_model % cfg.d_qk != 0 or cfg.d_model % 2 != 0:
            raise ValueError(f"the Transformer baseline splits d_model into heads of width d_qk and adds sinusoids: "
                             f"d_model must be even and divisible by d_qk, got d_model={cfg.d_model}, "
                             f"d_qk={cfg.d_qk}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(TransformerEncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, ids: torch.Tensor, *, mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> ClassifierOutput:
        """Classify ``ids [B, T]``; ``mask [B, T]`` True for real tokens; ``labels [B]``."""
        check_token_ids(ids, self.cfg.vocab_size, "ids")
        mask = as_mask(mask, ids.shape, "mask", of="ids")
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids) + sinusoids(positions, self.cfg.d_model, dtype=self.embed.weight.dtype)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.norm(x), mask, x.new_zeros((), dtype=torch.float32), labels)


class TransformerVQEncoderClassifier(Codebooks, nn.Module):
    """Transformer-VQ as an encoder classifier: ``model(ids, mask=..., labels=...)`` -> :class:`ClassifierOutput`."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.head = PoolingHead(cfg.d_model, cfg.n_classes, cfg.commit_coef)  # n_classes first: a LM config
        check_baseline_config(cfg, "Transformer-VQ encoder", "RMS")
        self.cfg = cfg
        try:  # tied embeddings: the encoder's output head (token logits) is not used here, so it holds no parameters
            encoder_cfg = TransformerVQConfig(
                vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_k=cfg.d_qk, d_v=cfg.d_v, n_layers=cfg.n_layers,
                n_code=cfg.n_code, block_len=cfg.block_len, causal=False, tie_embeddings=True, dropres=cfg.dropout,
                commit_coef=cfg.commit_coef, ema_rate=cfg.ema_rate, dead_code_restart=cfg.dead_code_restart)
        except ConfigError as err:  # named as the LongVQConfig the user wrote (d_qk is the encoder's d_k)
            raise ValueError(f"the Transformer-VQ encoder baseline cannot be built from this LongVQConfig: "
                             f"{err.detail()}") from None
        self.encoder = TransformerVQ(encoder_cfg)

    def forward(self, ids: torch.Tensor, *, mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                attention: str = "linear") -> ClassifierOutput:
        """Classify ``ids [B, T]``; ``mask [B, T]`` True for real tokens; ``labels [B]``."""
        check_token_ids(ids, self.cfg.vocab_size, "ids")
        mask = as_mask(mask, ids.shape, "mask", of="ids")
        x, _, commit_loss = self.encoder.features(ids, mask=mask, attention=attention)  # (B, T, D)
        return self.head(x, mask, commit_loss, labels)
