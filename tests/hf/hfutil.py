"""Helpers of the Hugging Face tests (a module name of its own: every test directory has a conftest)."""

from __future__ import annotations

import torch

from transformer_vq import TransformerVQ, preset


def tiny_model(**overrides) -> TransformerVQ:
    """The tiny preset (block_len 8) with trained-looking, non-zero position parameters, in eval mode."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", **{"vocab_size": 64, **overrides})).eval()
    with torch.no_grad():
        for unit in model.units:
            unit.u.normal_(std=0.5)
            unit.v_r.normal_(std=0.5)
    return model
