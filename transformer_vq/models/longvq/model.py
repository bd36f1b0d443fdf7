"""LongVQ models: a sequence classifier (Sec. 6: mean of the output tokens, then a linear layer) and a causal
language model (Sec. 7) with a constant-size decoding state. Both are an embedding and ``n_layers`` LongVQ blocks.

Letters: B batch, T positions, D model width, V vocabulary, C classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_vq.config import LongVQConfig
from transformer_vq.models.longvq.layer import LongVQBlock
from transformer_vq.models.tvq.model import ModelOutput, TransformerVQ
from transformer_vq.nn.codebooks import Codebooks
from transformer_vq.nn.inputs import as_mask, causal_padding, check_token_ids
from transformer_vq.nn.pooling import ClassifierOutput, PoolingHead
from transformer_vq.nn.state import ModelState, check_continued_state
from transformer_vq.nn.token_mean import token_mean


class LongVQBackbone(nn.Module):
    """Token embedding and ``n_layers`` LongVQ blocks (no position embedding: the SSM orders the tokens)."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(LongVQBlock(cfg) for _ in range(cfg.n_layers))

    def forward(self, ids: torch.Tensor, *, state: ModelState | None = None, mask: torch.Tensor | None = None,
                attention: str = "linear") -> tuple[torch.Tensor, ModelState | None, torch.Tensor]:
        """``(x [B, T, D], state, commit_loss)`` for token ids ``[B, T]``; ``state``: ``None`` for an encoder, and
        after ``attention="quadratic"``."""
        check_token_ids(ids, self.cfg.vocab_size, "ids")
        mask = as_mask(mask, ids.shape, "mask", of="ids")
        if state is not None:
            check_continued_state(state, len(self.blocks), "LongVQ model")
        padded = self.cfg.causal and causal_padding(mask)
        x = self.embed(ids)  # (B, T, D)
        commit_loss = x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32))
        states = []
        for i, block in enumerate(self.blocks):
            out = block(x, state=None if state is None else state.layers[i], mask=mask, attention=attention)
            x, commit_loss = out.x, commit_loss + out.commit_loss
            states.append(out.state)
        if states[0] is None:
            return x, None, commit_loss
        return x, ModelState(states[0].offset, states, padded), commit_loss


class LongVQClassifier(Codebooks, nn.Module):
    """LongVQ for sequence classification: ``model(ids, mask=..., labels=...)`` -> :class:`ClassifierOutput`."""

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        self.head = PoolingHead(cfg.d_model, cfg.n_classes, cfg.commit_coef)
        self.cfg = cfg
        self.backbone = LongVQBackbone(cfg)

    def forward(self, ids: torch.Tensor, *, mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                attention: str = "linear") -> ClassifierOutput:
        """Classify ``ids [B, T]``; ``mask [B, T]`` True for real tokens (``None``: all real); ``labels [B]``."""
        x, _, commit_loss = self.backbone(ids, mask=mask, attention=attention)  # checks ids and mask
        return self.head(x, as_mask(mask, ids.shape, "mask", of="ids"), commit_loss, labels)


class LongVQLM(Codebooks, nn.Module):
    """LongVQ as a causal language model: ``model(ids, state, targets=...)`` -> :class:`ModelOutput`.

    Passing the returned ``state`` back continues the same sequences; its size does not grow with their length
    (per block: the SSM's ``[B, D, h]`` EMA and the VQ attention state: a per-code cache and at most ``2L - 1`` keys).
    ``stream`` and ``generate`` sample as :class:`~transformer_vq.models.tvq.model.TransformerVQ` does.
    """

    def __init__(self, cfg: LongVQConfig):
        super().__init__()
        if cfg.n_classes != 0 or not cfg.causal:
            raise ValueError("a language model needs n_classes 0 and causal true")
        self.cfg = cfg
        self.backbone = LongVQBackbone(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids: torch.Tensor, state: ModelState | None = None, *, targets: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, attention: str = "linear") -> ModelOutput:
        """Next-token logits ``[B, T, V]`` of ``ids [B, T]``; with ``targets [B, T]``, the loss of eq. 23, its
        cross-entropy averaged over the positions where ``loss_mask [B, T]`` is True (``None``: all)."""
        if targets is not None:  # before the forward: a bad target must not cost one
            check_token_ids(targets, self.cfg.vocab_size, "targets", shape=ids.shape, shape_name="ids")
        loss_mask = as_mask(loss_mask, ids.shape, "loss_mask", of="ids")
        x, new_state, commit_loss = self.backbone(ids, state=state, attention=attention)
        logits = self.head(x)
        result = ModelOutput(logits=logits, state=new_state, commit_loss=commit_loss)
        if targets is not None:
            ce = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
                                 targets.flatten(), reduction="none")
            result.ce_loss = token_mean(ce, None if loss_mask is None else loss_mask.flatten())
            result.loss = result.ce_loss + self.cfg.commit_coef * commit_loss
        return result

    # Sampling is the same loop over ``forward`` with a carried state as Transformer-VQ's.
    stream = TransformerVQ.stream
    generate = TransformerVQ.generate
    _sampled = TransformerVQ._sampled
    _sampling_steps = TransformerVQ._sampling_steps
