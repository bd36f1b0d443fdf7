"""``token_mean``: the mean of a per-token loss over the real tokens."""

from __future__ import annotations

import torch

from transformer_vq.nn.token_mean import token_mean


def test_without_a_mask_it_is_the_mean_and_with_one_the_mean_of_the_real_tokens():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]])
    assert float(token_mean(values, None)) == 4.0
    mask = torch.tensor([[True, False, True], [False, False, True]])
    torch.testing.assert_close(token_mean(values, mask), torch.tensor((1.0 + 3.0 + 9.0) / 3))
    # a batch of padding alone: zero, not 0 / 0
    assert float(token_mean(values, torch.zeros_like(mask))) == 0.0


def test_gradients_reach_only_the_real_tokens():
    values = torch.ones(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    token_mean(values, mask).backward()
    torch.testing.assert_close(values.grad, mask.float() / 3)
