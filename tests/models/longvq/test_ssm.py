"""The damped-EMA SSM module of LongVQ: pieces with a carried state == the whole sequence, one token at a time with a
constant state, the bidirectional form == its definition, precision kept under autocast. The math itself (FFT
convolution == recurrence, outputs, states, gradients) is tested in tests/ops/ema/."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.models.longvq.ssm import DampedEMA, EMAState

# float64: both forms are exact math, so they agree to rounding
TOL = dict(rtol=1e-10, atol=1e-10)


def ssm(bidirectional=False, dim=3, ema_dim=4, seed=0):
    torch.manual_seed(seed)
    module = DampedEMA(dim, ema_dim, bidirectional=bidirectional).double()
    with torch.no_grad():  # spread the decays over (0, 1) so short and long memories both take part
        module.alpha.normal_(std=1.5)
        module.delta.normal_(std=1.5)
    return module


def inputs(length, dim=3, batch=2, seed=1):
    return torch.randn(batch, length, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("split", range(1, 20))
def test_split_at_any_point_with_the_carried_state_gives_the_whole(split):
    module = ssm()
    x = inputs(20)
    whole, whole_state = module(x)
    first, state = module(x[:, :split])
    second, state = module(x[:, split:], state)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, **TOL)
    torch.testing.assert_close(state.h, whole_state.h, **TOL)


def test_token_by_token_decoding_gives_the_whole_and_a_constant_state():
    module = ssm()
    x = inputs(12)
    whole, _ = module(x)
    state, pieces, sizes = None, [], set()
    for t in range(12):
        y, state = module(x[:, t:t + 1], state)
        pieces.append(y)
        sizes.add(state.nbytes())
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOL)
    assert sizes == {2 * 3 * 4 * 8}  # [B, D, N] float64, whatever the number of tokens consumed


@pytest.mark.parametrize("length", [1, 9, 30])
def test_bidirectional_equals_its_definition(length):
    module = ssm(bidirectional=True)
    x = inputs(length)
    fast, state = module(x)
    naive, _ = module(x, naive=True)
    assert state is None
    torch.testing.assert_close(fast, naive, **TOL)


def test_bidirectional_output_depends_on_later_inputs_and_causal_does_not():
    x = inputs(10)
    changed = x.clone()
    changed[:, 9] += 1.0
    causal, bidirectional = ssm(), ssm(bidirectional=True)
    torch.testing.assert_close(causal(x)[0][:, :9], causal(changed)[0][:, :9], **TOL)
    assert (bidirectional(x)[0][:, 0] - bidirectional(changed)[0][:, 0]).abs().max() > 1e-6


@pytest.mark.parametrize("bidirectional", [False, True])
def test_autocast_does_not_lower_the_precision(bidirectional):
    module = ssm(bidirectional=bidirectional).float()
    x = inputs(50).float()
    with torch.no_grad():
        plain, _ = module(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast, _ = module(x)
    assert cast.dtype == torch.float32
    torch.testing.assert_close(cast, plain, rtol=0, atol=0)



@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_low_precision_parameters_compute_in_float32(bidirectional, low):
    """A model cast to bfloat16 or float16 (``model.to(dtype)``, not autocast): the SSM computes its coefficients and
    the filter in float32 from the rounded parameters, so its output is the float32 module's, rounded once."""
    low_module = ssm(bidirectional=bidirectional).to(low)
    exact = ssm(bidirectional=bidirectional).to(low).float()  # the same rounded parameters, held in float32
    x = inputs(50).to(low)
    state = None if bidirectional else EMAState(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2)))
    with torch.no_grad():
        y, new_state = low_module(x, state)
        want, want_state = exact(x.float(), state)
    assert y.dtype == low
    torch.testing.assert_close(y, want.to(low), rtol=0, atol=0)
    if not bidirectional:
        assert new_state.h.dtype == torch.float32
        torch.testing.assert_close(new_state.h, want_state.h, rtol=0, atol=0)

def test_bidirectional_refuses_a_state():
    module = ssm(bidirectional=True)
    with pytest.raises(ValueError, match="a bidirectional SSM reads whole sequences and carries no state"):
        module(inputs(4), EMAState(torch.zeros(2, 3, 4, dtype=torch.float64)))


def test_gradients_reach_every_parameter():
    module = ssm(bidirectional=True)
    module(inputs(8))[0].square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_timescale_initialization_spreads_the_memories_up_to_the_timescale():
    """``timescale`` T: ``alpha = 1 / tau`` with ``tau`` log-uniform over [1.5, T] (log tau uniform: its quartiles
    where they should be); 0 keeps Mega's ``alpha`` logits N(0, 0.2^2). A sequence's last token then still carries
    its first one at T = 1024 and not at Mega's decays."""
    torch.manual_seed(0)
    long = DampedEMA(64, 16, bidirectional=True, timescale=1024.0)
    tau = 1 / torch.sigmoid(long.alpha.detach().double())
    assert tau.min() >= 1.5 - 1e-9 and tau.max() <= 1024 + 1e-6
    log_tau = ((tau.log() - torch.log(torch.tensor(1.5)))
               / (torch.log(torch.tensor(1024.0)) - torch.log(torch.tensor(1.5))))
    quartiles = torch.quantile(log_tau.flatten(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.double))
    torch.testing.assert_close(quartiles, torch.tensor([0.25, 0.5, 0.75], dtype=torch.double), rtol=0, atol=0.03)
    torch.manual_seed(0)
    mega = DampedEMA(64, 16, bidirectional=True)
    assert mega.alpha.abs().max() < 1.5 and 0.15 < mega.alpha.std() < 0.25
    x = torch.zeros(1, 1024, 64, dtype=torch.double)
    x[:, 0] = 1.0
    row, last = ({name: ssm.double()(x)[0][0, t].abs().mean().item() for name, ssm in (("long", long), ("mega", mega))}
                 for t in (32, 1023))
    assert row["long"] > 20 * row["mega"]  # the pixel below, in a 32 x 32 image read in raster order
    assert last["long"] > 1e-4 and last["mega"] < 1e-12


def test_timescale_must_be_zero_or_at_least_two():
    from transformer_vq.config import ConfigError, longvq_preset

    with pytest.raises(ConfigError, match="ema_timescale"):
        longvq_preset("tiny", ema_timescale=1.0)
    assert longvq_preset("tiny", ema_timescale=2.0).ema_timescale == 2.0
