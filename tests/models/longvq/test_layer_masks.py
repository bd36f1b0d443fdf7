"""The exported LongVQ layer and block take the masks the models take (``transformer_vq.nn.inputs.as_mask``): bool,
or an integer 0/1 mask as a tokenizer returns one. An integer mask was a torch RuntimeError from inside the layer
(``masked_fill_ only supports boolean masks``)."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.config import longvq_preset
from transformer_vq.models.longvq import LongVQBlock
from transformer_vq.models.longvq.layer import LongVQLayer

MASK = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])
CASES = [(causal, kind) for causal in (False, True) for kind in (LongVQBlock, LongVQLayer)]


def _module(kind, causal: bool):
    torch.manual_seed(0)
    cfg = longvq_preset("tiny", n_classes=0 if causal else 2, causal=causal)
    return kind(cfg).eval(), torch.randn(2, 8, cfg.d_model)


@pytest.mark.parametrize("causal, kind", CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_masks_give_the_bool_masks_output_bit_for_bit(causal, kind, dtype):
    module, x = _module(kind, causal)
    with torch.no_grad():
        ref = module(x, mask=MASK)
        out = module(x, mask=MASK.to(dtype))
    assert torch.equal(out.x, ref.x)
    assert torch.equal(out.commit_loss, ref.commit_loss)


@pytest.mark.parametrize("causal", [False, True])
def test_integer_masks_train_the_codebook_as_the_bool_mask(causal):
    """Padding stays out of the codebook statistics (and batch norm's) with an integer mask too."""
    stats = []
    for mask in (MASK, MASK.long()):
        block, x = _module(LongVQBlock, causal)
        block.train()(x, mask=mask)
        stats.append(block.layer.quantizer.acc_count.clone())
    assert torch.equal(*stats)
    assert float(stats[0].sum()) == float(MASK.sum())


@pytest.mark.parametrize("kind", [LongVQBlock, LongVQLayer])
def test_a_floating_mask_is_refused_by_name(kind):
    module, x = _module(kind, False)
    with pytest.raises(ValueError, match="mask must be a bool or integer"):
        module(x, mask=MASK.float())
