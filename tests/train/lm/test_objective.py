"""The masked-token objective of encoders: which positions are masked, and that the draw is reproducible and the
same for any split of a global batch over workers."""

from types import SimpleNamespace

import pytest
import torch

from transformer_vq.train.lm.objective import mask_generator, mask_tokens, masked_window


def test_masks_the_rate_of_every_row_with_the_mask_token_and_keeps_the_rest():
    tokens = torch.randint(0, 256, (4, 2048))
    inputs, masked = mask_tokens(tokens, mask_rate=0.15, mask_token_id=256, generator=mask_generator(3))
    # exactly round(0.15 * 2048) a row: equal counts make every worker's mean loss weigh rows as one process's
    assert masked.sum(dim=1).tolist() == [307] * 4
    assert torch.equal(inputs[masked], torch.full((int(masked.sum()),), 256))
    assert torch.equal(inputs[~masked], tokens[~masked])


def test_every_row_with_a_real_token_gets_a_masked_position_and_padding_none():
    tokens = torch.randint(0, 256, (3, 8))
    real = torch.zeros(3, 8, dtype=torch.bool)
    real[0, :2] = True  # a row that a rate this low would leave unmasked
    real[1] = True
    _, masked = mask_tokens(tokens, mask_rate=1e-6, mask_token_id=256, generator=mask_generator(0), real=real)
    assert masked.sum(dim=1).tolist() == [1, 1, 0]
    assert not masked[~real].any()


def test_the_draw_depends_on_seed_step_and_row_only():
    tokens = torch.zeros(2, 64, dtype=torch.long)
    def draw(*key):
        return mask_tokens(tokens, mask_rate=0.3, mask_token_id=9, generator=mask_generator(*key))[1]
    assert torch.equal(draw(1, 5, 0), draw(1, 5, 0))
    assert not torch.equal(draw(1, 5, 0), draw(1, 6, 0))
    assert not torch.equal(draw(1, 5, 0), draw(1, 5, 1))
    assert not torch.equal(draw(1, 5, 0), draw(2, 5, 0))


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.1])
def test_refuses_a_rate_outside_zero_one(rate):
    with pytest.raises(ValueError, match="mask_rate must lie strictly between 0 and 1"):
        mask_tokens(torch.zeros(1, 4, dtype=torch.long), mask_rate=rate, mask_token_id=9, generator=mask_generator(0))


@pytest.mark.parametrize("workers", [2, 4])
def test_the_workers_masks_of_a_global_batch_are_one_process_s(workers):
    """A worker reads a contiguous share of the global batch's rows (data/batches): masked from their global row
    indices, the shares put together are the batch as one process masks it, whatever the number of workers."""
    cfg = SimpleNamespace(mask_rate=0.15, mask_token_id=256)
    batch = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(1))
    whole = masked_window(batch, cfg=cfg, seed=4, step=7, first_row=0)
    rows = len(batch) // workers
    shares = [masked_window(batch[r * rows:(r + 1) * rows], cfg=cfg, seed=4, step=7, first_row=r * rows)
              for r in range(workers)]
    for part, got in enumerate(zip(*shares)):
        assert torch.equal(torch.cat(got), whole[part])
    assert len({int(share[2].sum()) for share in shares}) == 1  # every worker's loss is a mean over as many tokens
