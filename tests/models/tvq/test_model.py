"""TransformerVQ: linear = quadratic, windows with state = whole, greedy decoding, causality, variants."""

from __future__ import annotations

import pytest
import torch

from transformer_vq import GatedAttentionUnit, TransformerVQ, preset
from transformer_vq.config import SampleConfig
from transformer_vq.nn.sampling import sample_next_token

VARIANTS = {
    "shga": dict(),
    "mqa": dict(head_type="mqa", n_head=2, d_v=64),
    "mha": dict(head_type="mha", n_head=2, d_v=64),
    "image": dict(abs_pos=True, final_norm=True, tie_embeddings=True),
    "qk": dict(quantize_queries=True),
    "qk-mha": dict(quantize_queries=True, head_type="mha", n_head=2, d_v=64),
}


def tiny_model(seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    cfg = preset("tiny", n_layers=2, n_code=6, block_len=4, **overrides)
    model = TransformerVQ(cfg).to(dtype).eval()
    with torch.no_grad():
        model.abs_pos_scale is not None and model.abs_pos_scale.fill_(0.5)  # exercise the term
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_linear_equals_quadratic(variant):
    model = tiny_model(**VARIANTS[variant])
    ids = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(1))
    linear = model(ids).logits
    quadratic = model(ids, attention="quadratic").logits
    torch.testing.assert_close(linear, quadratic, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_windows_with_state_equal_whole(variant):
    model = tiny_model(**VARIANTS[variant])
    ids = torch.randint(0, 256, (2, 41), generator=torch.Generator().manual_seed(2))
    whole = model(ids).logits
    state, pieces = None, []
    for a, b in [(0, 8), (8, 9), (9, 22), (22, 24), (24, 41)]:
        out = model(ids[:, a:b], state)
        state = out.state.detach()
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    assert state.offset == 41


def test_training_windows_match_whole_sequence_loss_and_codebook_stats():
    """Truncated-backprop windows see the same numbers as one pass (dropout off)."""
    model = tiny_model().train()
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(3))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    whole = model(inputs, targets=targets)
    whole_stats = [t.clone() for t in model.codebook_stats()]
    model.reset_codebook_stats()
    state, ce = None, 0.0
    for a in range(0, 32, 8):
        out = model(inputs[:, a:a + 8], state, targets=targets[:, a:a + 8])
        state, ce = out.state.detach(), ce + out.ce_loss.item() / 4
    assert abs(ce - whole.ce_loss.item()) < 1e-10
    for got, want in zip(model.codebook_stats(), whole_stats):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("variant", ["shga", "mha", "qk"])
def test_greedy_generate_equals_argmax_of_full_forward(variant):
    model = tiny_model(dtype=torch.float32, **VARIANTS[variant])
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(4))
    out = model.generate(prompt, 30, temperature=0)
    assert out.shape == (2, 35) and torch.equal(out[:, :5], prompt)
    for t in range(5, 35):
        expected = model(out[:, :t]).logits[:, -1].argmax(-1)
        assert torch.equal(out[:, t], expected), f"step {t}"


def test_sampling_is_reproducible_with_a_generator():
    model = tiny_model(dtype=torch.float32)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    a = model.generate(prompt, 20, top_p=0.9, generator=torch.Generator().manual_seed(7))
    b = model.generate(prompt, 20, top_p=0.9, generator=torch.Generator().manual_seed(7))
    c = model.generate(prompt, 20, top_p=0.9, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("family", ["tvq", "longvq"])
def test_a_generation_continues_from_its_returned_state_with_the_new_tokens_alone(family):
    """``generate(..., return_state=True)`` returns the state that read every token of its result: a conversation
    goes on with its next tokens alone (nothing read again) and gets the tokens that reading everything gives, greedy
    and seeded alike; the state may also come from a forward call."""
    from transformer_vq.config import LongVQConfig
    from transformer_vq.models.longvq.model import LongVQLM

    torch.manual_seed(0)
    model = tiny_model() if family == "tvq" else LongVQLM(LongVQConfig(
        vocab_size=64, d_model=16, d_qk=8, d_v=16, n_layers=2, block_len=4, n_code=6, causal=True)).double().eval()
    prompt, reply = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    for options in (dict(temperature=0), dict(top_p=0.9)):
        ids, state = model.generate(prompt, 6, return_state=True, **options, generator=torch.Generator().manual_seed(1))
        whole = torch.cat([ids, reply], dim=1)
        alone = model.generate(reply, 9, state=state, **options, generator=torch.Generator().manual_seed(2))
        again = model.generate(whole, 9, **options, generator=torch.Generator().manual_seed(2))
        assert torch.equal(alone, again[:, ids.shape[1]:])
        assert torch.equal(ids, model.generate(prompt, 6, **options, generator=torch.Generator().manual_seed(1)))
    from_forward = model(whole[:, :-1]).state
    assert torch.equal(model.generate(whole[:, -1:], 3, state=from_forward, temperature=0)[:, 1:],
                       model.generate(whole, 3, temperature=0)[:, whole.shape[1]:])
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[1]))
    try:
        assert model.generate(prompt, 0, return_state=True)[1].offset == 7  # no token sampled: the prompt's state
        assert torch.equal(model.generate(prompt, 0), prompt) and list(model.stream(prompt, 0)) == []
    finally:
        hook.remove()
    assert calls == [7]  # the prompt read once, for the state asked; not at all without it
    with pytest.raises(ValueError, match="return_state must be True or False, got 1"):
        model.generate(prompt, 2, return_state=1)


def test_a_stream_checks_its_arguments_at_the_call_and_holds_no_mode_between_tokens():
    """A bad argument is refused where the stream is made, not at its first token; between two tokens the model is in
    its own mode (a training step there trains), and each token is still sampled in eval mode: the tokens are the
    greedy generation's."""
    model = tiny_model().train()
    prompt = torch.randint(0, 64, (2, 5))
    for bad in (dict(max_new_tokens=-1), dict(max_new_tokens=2, temperature=-1.0), dict(max_new_tokens=2, top_p=2)):
        with pytest.raises(ValueError):
            model.stream(prompt, **bad)  # no next(): the call itself refuses
    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    tokens = model.stream(prompt, 3, temperature=0)
    first = next(tokens)
    assert model.training  # between two tokens: the model's own mode
    rest = list(tokens)
    assert modes == [False, False, False] and model.training
    assert torch.equal(torch.stack([first, *rest], dim=1), model.generate(prompt, 3, temperature=0)[:, 5:])


def test_nucleus_and_top_k_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    draws = {int(sample_next_token(logits, top_p=0.8, generator=gen)) for _ in range(300)}
    assert draws == {0, 1}  # 0.5 + 0.3 reaches 0.8: the nucleus is the first two tokens
    draws = {int(sample_next_token(logits, top_k=3, generator=gen)) for _ in range(300)}
    assert draws == {0, 1, 2}
    assert int(sample_next_token(logits, top_k=1, generator=gen)) == 0
    assert int(sample_next_token(logits, temperature=0)) == 0


def test_top_k_0_is_every_token_as_in_transformers_and_greedy_may_say_it():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for top_k in (0, None):
        torch.manual_seed(1)
        drawn = sample_next_token(logits, top_k=top_k, generator=torch.Generator().manual_seed(2))
        assert torch.equal(drawn, sample_next_token(logits, generator=torch.Generator().manual_seed(2)))
    assert torch.equal(sample_next_token(logits, temperature=0, top_k=0), logits.argmax(-1))  # 0 restricts nothing
    assert SampleConfig(temperature=0, top_k=0).top_k == 0


@pytest.mark.parametrize("temperature", [1e-5, 1e-9, 1e-37, 1e-44, 5e-324])
def test_a_temperature_however_small_samples_the_most_likely_token(temperature):
    """Logits divided by a tiny temperature pass float32's range (a logit of 34 at 1e-37) and would give NaN: the
    logits less their maximum are divided instead; a temperature below float32's smallest number is that number."""
    logits = torch.tensor([[30.0, 34.0, -5.0, 33.999], [-40.0, -41.0, -60.0, -45.0]])
    for seed in range(20):
        drawn = sample_next_token(logits, temperature=temperature, generator=torch.Generator().manual_seed(seed))
        assert drawn.tolist() == [1, 0]


def test_numpy_numbers_are_sampling_settings_and_configs_hold_python_numbers():
    """numpy's numbers (what a sweep over np.linspace gives) are taken for every number field of every config, and
    stored as the Python numbers they are (a config is written as JSON)."""
    import dataclasses
    import json

    import numpy as np

    logits = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    given = dict(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float32(0.9))
    plain = dict(temperature=float(np.float32(0.5)), top_k=3, top_p=float(np.float32(0.9)))
    assert torch.equal(sample_next_token(logits, **given, generator=torch.Generator().manual_seed(4)),
                       sample_next_token(logits, **plain, generator=torch.Generator().manual_seed(4)))
    cfg = SampleConfig(**given, max_new_tokens=np.int32(7))
    assert [type(v) for v in (cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens)] == [float, int, float, int]
    model_cfg = preset("tiny", d_model=np.int64(32))
    assert type(model_cfg.d_model) is int and json.loads(json.dumps(dataclasses.asdict(model_cfg)))["d_model"] == 32
    # np.float64 is a subclass of float (it stayed np.float64), and 0-d torch and numpy floats are numbers too
    for number in (np.float64(0.9), torch.tensor(0.9, dtype=torch.float64), np.array(0.9)):
        cfg = SampleConfig(top_p=number, temperature=number)
        assert (type(cfg.top_p), cfg.top_p, type(cfg.temperature)) == (float, 0.9, float), number
    assert type(preset("tiny", max_wavelength=np.float64(1e5)).max_wavelength) is float
    # settings once accepted are remembered: a value equal to one of them but of another type is still refused
    with pytest.raises(ValueError, match=r"top_k must be an integer, got np.float32\(3.0\)"):
        sample_next_token(logits, top_k=np.float32(3))
    sample_next_token(logits, top_k=1)
    with pytest.raises(ValueError, match=r"top_k must be an integer, got True"):
        sample_next_token(logits, top_k=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), "temperature must be >= 0"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=[1.0]), r"temperature must be a number, got \[1.0\]"),  # unhashable: no TypeError
    (dict(top_k=[3]), r"top_k must be an integer, got \[3\]"),
])
def test_sampling_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_next_token(torch.zeros(1, 4), **kwargs)


# tvq sample refuses these (tests/cli/test_values.py): the same rules, SampleConfig's, in the same words
GREEDY_REFUSES = "applies only with temperature above 0 (this run has temperature 0.0), got {}; leave it out, or set " \
                 "temperature as it needs"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=0.0, top_k=5), "top_k " + GREEDY_REFUSES.format(5)),
    (dict(temperature=0.0, top_p=0.5), "top_p " + GREEDY_REFUSES.format(0.5)),
], ids=["greedy-top-k", "greedy-top-p"])
def test_generate_refuses_what_tvq_sample_refuses(kwargs, message):
    model = tiny_model()
    with pytest.raises(ValueError) as caught:
        model.generate(torch.ones(1, 3, dtype=torch.long), 2, **kwargs)
    assert str(caught.value) == message
    with pytest.raises(ValueError) as caught:
        sample_next_token(torch.zeros(1, 4), **kwargs)
    assert str(caught.value) == message


def test_layer_causality_by_jacobian():
    """Row t of the Jacobian (contracted with a random vector): zero for inputs s > t, non-zero for s <= t."""
    model = tiny_model()
    unit: GatedAttentionUnit = model.units[0]
    T = 11
    x = torch.randn(1, T, model.cfg.d_model, dtype=torch.float64, requires_grad=True)
    y = unit(x).x
    weight = torch.randn_like(y)
    for t in range(T):
        (grad,) = torch.autograd.grad((y[:, t] * weight[:, t]).sum(), x, retain_graph=True)
        dep = grad.abs().sum(dim=(0, 2))  # (T_in,)
        assert torch.all(dep[t + 1:] == 0), f"output {t} depends on a later input"
        assert torch.all(dep[:t + 1] > 0), f"output {t} ignores an earlier input"


def test_token_outside_vocabulary_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"token id 300, outside the vocabulary \[0, 256\)"):
        model(torch.tensor([[1, 300]]))
    with pytest.raises(ValueError, match=r"\[batch, length\] int64"):
        model(torch.tensor([1, 2]))


def test_targets_of_another_shape_are_a_clear_error():
    model = tiny_model()
    ids = torch.ones(2, 10, dtype=torch.long)
    with pytest.raises(ValueError) as caught:
        model(ids, targets=ids[:, :9])
    assert str(caught.value) == ("targets must have the shape of input_ids (2, 10) (one target per input position), "
                                 "got (2, 9)")


def test_quadratic_mode_refuses_a_state():
    model = tiny_model()
    state = model(torch.ones(1, 3, dtype=torch.long)).state
    with pytest.raises(ValueError, match="pass state=None"):
        model(torch.ones(1, 3, dtype=torch.long), state, attention="quadratic")


def test_loss_is_cross_entropy_plus_scaled_commit_loss():
    model = tiny_model(commit_coef=0.5)
    ids = torch.randint(0, 256, (2, 9))
    out = model(ids[:, :-1], targets=ids[:, 1:])
    expected_ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 256).float(), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.ce_loss.double(), expected_ce.double())
    torch.testing.assert_close(out.loss, out.ce_loss + 0.5 * out.commit_loss)
    assert out.commit_loss > 0


def test_training_step_reaches_every_parameter():
    model = tiny_model(dtype=torch.float32, head_type="mqa", n_head=2, d_v=64).train()
    ids = torch.randint(0, 256, (2, 17))
    model(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


@pytest.mark.parametrize("name, low, high", [("enwik8", 180e6, 195e6), ("pg19", 1.25e9, 1.35e9),
                                             ("imagenet64", 1.15e9, 1.3e9)])
def test_presets_have_the_papers_parameter_counts(name, low, high):
    """Table 10 quotes 190M, 1.3B and 1.2B (rounded); the projections alone give 184M, 1.31B, 1.25B."""
    with torch.device("meta"):
        model = TransformerVQ(preset(name))
    assert low <= model.num_parameters() <= high


@pytest.mark.parametrize("attn_type", ["full", "flash_quad", "flash"])
@pytest.mark.parametrize("head_type,n_head", [("shga", 1), ("mqa", 2), ("mha", 2)])
def test_model_with_baseline_continues_through_state(attn_type, head_type, n_head):
    """The model dispatches to the baseline cores; windows fed with the state carried equal the whole sequence."""
    torch.manual_seed(0)
    cfg = preset("tiny", attn_type=attn_type, head_type=head_type, n_head=n_head, flash_chunk_len=4)
    model = TransformerVQ(cfg).double().eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 29))
    whole = model(ids).logits
    state, pieces = None, []
    for a, b in [(0, 5), (5, 6), (6, 20), (20, 29)]:
        out = model(ids[:, a:b], state)
        state = out.state
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    assert state.offset == 29 and state.nbytes() > 0
