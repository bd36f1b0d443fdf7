"""Training a :class:`~transformer_vq.hf.TransformerVQForCausalLM` with ``transformers.Trainer``: the codebook step.

The optimizer trains the weights; the codebooks are not parameters but exponential moving averages of the keys
assigned to each code (Eq. 29-31), updated after every optimizer step from statistics the forward accumulates.
``tvq train`` does this itself; ``Trainer`` knows nothing of it, so without :class:`CodebookCallback` the codebooks
keep their initial values. docs/huggingface.md shows the use.
"""

from __future__ import annotations

import torch.distributed as dist
from transformers import TrainerCallback


class CodebookCallback(TrainerCallback):
    """``Trainer(..., callbacks=[CodebookCallback()])``: the codebooks' EMA step after each optimizer step, from the
    statistics of every micro-batch of that step (summed over processes when ``torch.distributed`` runs)."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        library = model.model  # the wrapped TransformerVQ
        if dist.is_available() and dist.is_initialized():
            for tensor in library.codebook_stats(dist.get_rank(), dist.get_world_size()):
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        library.update_codebooks()
