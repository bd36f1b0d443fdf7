"""LongVQ: the linear-time path equals the dense formulas, a causal model continues through its state and decodes
greedily like its full forward, a classifier ignores padding, learns, and reaches every parameter; the baselines; the
config's rules."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.config import CLASSIFY_PRESETS, ConfigError, LongVQConfig, longvq_preset
from transformer_vq.config.longvq import LONGVQ_LM_PRESETS
from transformer_vq.models.baselines.classifiers import (TransformerClassifier, TransformerVQEncoderClassifier,
                                                        dense_key_masked_attention, key_masked_attention)
from transformer_vq.models.longvq.layer import LongVQLayer, SequenceNorm
from transformer_vq.models.longvq.model import LongVQClassifier, LongVQLM
from transformer_vq.nn.pooling import masked_mean
from transformer_vq.nn.quantizer import VectorQuantizer
from transformer_vq.ops.full.bidir import full_bidir_attention

TOL = dict(rtol=1e-10, atol=1e-10)  # float64: the linear-time forms are exact rewritings
CLASSIFIER = dict(n_classes=3, causal=False, block_len=4, n_code=6)
NORMS = ["layer", "batch", "scale"]
CAUSAL_NORMS = ["layer", "scale"]  # batch norm mixes positions: refused for causal models (tests/nn/test_causality.py)


def randomize(model):
    """Non-zero local biases, so the window terms take part."""
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "local_bias"):
                module.local_bias.normal_()
    return model


def classifier(seed=0, **overrides):
    torch.manual_seed(seed)
    return randomize(LongVQClassifier(longvq_preset("tiny", **{**CLASSIFIER, **overrides})).double().eval())


def language_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return randomize(LongVQLM(longvq_preset("tiny", block_len=4, n_code=6, **overrides)).double().eval())


def ids_of(shape, seed, high=256):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scoring", ["softmax", "relu2"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("length", [3, 16, 37])
def test_classifier_linear_equals_dense(scoring, norm, length):
    model = classifier(scoring=scoring, norm=norm)
    ids = ids_of((2, length), 1)
    torch.testing.assert_close(model(ids).logits, model(ids, attention="quadratic").logits, **TOL)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("offset", [0, 5])
def test_window_bias_is_the_learned_bias_of_each_query_key_distance(causal, offset):
    """Entry [t, j] is the bias of the distance from the query at offset + t to its window column j (0 where the
    causal window has no key), position by position; and so is its gradient."""
    L, T = 4, 13
    torch.manual_seed(0)
    layer = LongVQLayer(longvq_preset("tiny", block_len=L, causal=causal, n_classes=0 if causal else 3)).double()
    with torch.no_grad():
        layer.local_bias.normal_()
    bias = layer.window_bias(T, offset)
    weight = torch.randn(bias.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = torch.zeros_like(bias)
    for t in range(T):
        for j in range(bias.shape[1]):
            distance = (offset + t) % L + L - j  # query tau = offset + t, key (tau // L - 1) L + j
            if distance >= layer.first_distance:
                expected[t, j] = layer.local_bias[distance - layer.first_distance]
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)
    got, = torch.autograd.grad((bias * weight).sum(), layer.local_bias)
    want, = torch.autograd.grad((expected * weight).sum(), layer.local_bias)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length", [5, 37])
def test_language_model_linear_equals_dense(length):
    model = language_model()
    ids = ids_of((2, length), 2)
    torch.testing.assert_close(model(ids).logits, model(ids, attention="quadratic").logits, **TOL)


@pytest.mark.parametrize("norm", CAUSAL_NORMS)
def test_windows_with_carried_state_equal_the_whole_sequence(norm):
    model = language_model(norm=norm)
    ids = ids_of((2, 41), 3)
    whole = model(ids).logits
    state, pieces = None, []
    for a, b in [(0, 8), (8, 9), (9, 22), (22, 24), (24, 41)]:
        out = model(ids[:, a:b], state)
        state = out.state.detach()
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOL)
    assert state.offset == 41


def test_training_windows_match_the_whole_sequence_loss_and_codebook_stats():
    """Truncated-backprop windows see the numbers of one pass (dropout off, layer norm: no batch statistics)."""
    model = language_model().train()
    ids = ids_of((2, 33), 12)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    whole = model(inputs, targets=targets)
    whole_stats = [t.clone() for t in model.codebook_stats()]
    model.reset_codebook_stats()
    state, total = None, 0.0
    for a, b in [(0, 8), (8, 13), (13, 32)]:
        out = model(inputs[:, a:b], state, targets=targets[:, a:b])
        state = out.state.detach()
        total = total + out.ce_loss * (b - a) / 32
    torch.testing.assert_close(total, whole.ce_loss, **TOL)
    for got, want in zip(model.codebook_stats(), whole_stats):
        torch.testing.assert_close(got, want, **TOL)
    assert whole_stats[1].sum() == 2 * 32  # one key per token counted


def test_loss_mask_selects_the_positions_of_the_cross_entropy():
    model = language_model()
    ids, targets = ids_of((2, 9), 13), ids_of((2, 9), 14)
    loss_mask = torch.zeros(2, 9, dtype=torch.bool)
    loss_mask[0, 2] = loss_mask[1, 7] = True
    out = model(ids, targets=targets, loss_mask=loss_mask)
    logits = out.logits[loss_mask]
    torch.testing.assert_close(out.ce_loss, torch.nn.functional.cross_entropy(logits, targets[loss_mask]), **TOL)
    with pytest.raises(ValueError, match=r"targets holds token id 300, outside the vocabulary \[0, 256\)"):
        model(ids, targets=torch.full((2, 9), 300))


def test_decoding_state_size_depends_on_the_place_in_the_block_only():
    model = language_model()  # block_len 4
    ids = ids_of((1, 40), 4)
    state, sizes = None, []
    for t in range(40):
        state = model(ids[:, t:t + 1], state).state
        sizes.append(state.nbytes())
    # from the second block on, the size repeats with period L: it does not grow with the offset
    assert sizes[4:36] == sizes[8:40]


def test_token_by_token_decoding_equals_the_whole_sequence_in_a_bounded_state():
    """Decoding one token per call (the SSM's recurrence, the attention's carried cache) gives the logits of one
    forward pass over the whole sequence, and the state never outgrows what it holds after its second block."""
    model = language_model()  # block_len 4
    ids = ids_of((2, 21), 15)
    state, logits, sizes = None, [], []
    for t in range(21):
        out = model(ids[:, t:t + 1], state)
        state = out.state
        logits.append(out.logits)
        sizes.append(state.nbytes())
    torch.testing.assert_close(torch.cat(logits, dim=1), model(ids).logits, **TOL)
    assert state.offset == 21 and max(sizes) == max(sizes[:8])
    ssm_bytes = sum(layer.ssm.nbytes() for layer in state.layers)
    assert ssm_bytes == 2 * 2 * 32 * 4 * 8  # 2 layers of [B=2, D=32, h=4] float64, whatever the offset


def test_greedy_generate_equals_argmax_of_the_full_forward():
    model = language_model()
    prompt = ids_of((2, 6), 5)
    out = model.generate(prompt, 10, temperature=0.0)
    full = model(out[:, :-1]).logits
    assert torch.equal(out[:, 6:], full[:, 5:].argmax(-1))


def test_language_model_is_causal():
    model = language_model()
    ids = ids_of((1, 20), 6)
    changed = ids.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 256
    torch.testing.assert_close(model(ids).logits[:, :15], model(changed).logits[:, :15], **TOL)


@pytest.mark.parametrize("norm, causal", [(n, False) for n in NORMS] + [(n, True) for n in CAUSAL_NORMS],
                         ids=lambda v: {False: "encoder", True: "causal"}.get(v, v))
def test_appended_padding_changes_nothing(norm, causal):
    model = classifier(norm=norm, causal=causal)
    ids = ids_of((2, 21), 7)
    padded = torch.cat([ids, ids_of((2, 9), 8)], dim=1)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[:, :21] = True
    torch.testing.assert_close(model(padded, mask=mask).logits, model(ids).logits, **TOL)


def test_padding_takes_no_part_in_batch_norm_statistics_in_training():
    torch.manual_seed(0)
    norm = SequenceNorm("batch", 4).double().train()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    garbage = x.clone()
    garbage[1, 3:] = 1e6
    torch.testing.assert_close(norm(x, mask)[mask], norm(garbage, mask)[mask], **TOL)


def test_masked_mean_averages_real_tokens_only():
    x = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert masked_mean(x, torch.tensor([[True, True, False]])).item() == 2.0


@pytest.mark.parametrize("norm", NORMS)
def test_classifier_gradients_reach_every_parameter(norm):
    model = classifier(norm=norm).train()
    out = model(ids_of((3, 19), 9), mask=torch.ones(3, 19, dtype=torch.bool), labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_loss_is_cross_entropy_plus_scaled_commit_loss():
    model = classifier()
    out = model(ids_of((2, 9), 10), labels=torch.tensor([0, 2]))
    expected = torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2]))
    torch.testing.assert_close(out.ce_loss, expected, **TOL)
    torch.testing.assert_close(out.loss, expected + 1e-4 * out.commit_loss, **TOL)
    assert out.commit_loss > 0


def learn(model, steps=40, seed=0):
    """Class = whether token 1 occurs in the sequence (random lengths, padded): the first and last losses."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 8, (32, 12), generator=gen)
    labels = torch.randint(0, 2, (32,), generator=gen)
    ids[labels == 1, torch.randint(0, 6, (int(labels.sum()),), generator=gen)] = 1
    mask = torch.arange(12)[None] < torch.randint(6, 13, (32, 1), generator=gen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        out = model(ids, mask=mask, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        model.update_codebooks()
        losses.append(out.ce_loss.item())
    return losses[0], losses[-1]


@pytest.mark.parametrize("kind", [LongVQClassifier, TransformerClassifier, TransformerVQEncoderClassifier])
def test_every_classifier_learns_a_trivial_task(kind):
    torch.manual_seed(0)
    model = kind(longvq_preset("tiny", n_classes=2, causal=False, vocab_size=8, n_layers=1, n_code=8, block_len=4))
    first, last = learn(model.train())
    assert first > 0.6 and last < 0.2 * first


def test_classifiers_share_the_codebook_interface():
    cfg = longvq_preset("tiny", **CLASSIFIER)
    counts = {kind.__name__: len(kind(cfg).codebook_stats()) for kind in
              (LongVQClassifier, TransformerClassifier, TransformerVQEncoderClassifier)}
    # 4 statistics per quantizer: one per LongVQ block, one per gated attention unit, none for the Transformer
    assert counts == {"LongVQClassifier": 8, "TransformerClassifier": 0, "TransformerVQEncoderClassifier": 16}


def test_dead_code_restart_reaches_every_quantizer():
    cfg = longvq_preset("tiny", **CLASSIFIER, dead_code_restart=7)
    for model in (LongVQClassifier(cfg), TransformerVQEncoderClassifier(cfg), LongVQLM(longvq_preset(
            "tiny", dead_code_restart=7))):
        restarts = [m.dead_code_restart for m in model.modules() if isinstance(m, VectorQuantizer)]
        assert restarts and set(restarts) == {7}, type(model).__name__
    assert {m.dead_code_restart for m in LongVQClassifier(longvq_preset("tiny", **CLASSIFIER)).modules()
            if isinstance(m, VectorQuantizer)} == {0}  # off by default


@pytest.mark.parametrize("padded", [False, True])
def test_transformer_baseline_attention_equals_its_oracle(padded):
    """The baseline's fused kernel (SDPA) is full softmax attention over the real keys: outputs and gradients."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(3, 2, 11, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 11, dtype=torch.bool)
    if padded:  # trailing padding, interior padding, and a sequence of padding only
        mask[0, 7:], mask[1, 2:5], mask[2] = False, False, False
    fused = key_masked_attention(q, k, v, mask)
    oracle, _ = full_bidir_attention(q * 4 ** -0.5, k, v, block_len=4, mask=mask)
    dense = dense_key_masked_attention(q, k, v, mask)  # the speed tables' materialized baseline: the same function
    cotangent = torch.randn(fused.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad((oracle * cotangent).sum(), (q, k, v))
    for out in (fused, dense):
        torch.testing.assert_close(out, oracle, rtol=1e-12, atol=1e-12)
        grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v))
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_transformer_vq_encoder_pools_the_library_encoder():
    torch.manual_seed(0)
    model = TransformerVQEncoderClassifier(longvq_preset("tiny", **CLASSIFIER)).double().eval()
    ids = ids_of((2, 13), 11)
    torch.testing.assert_close(model(ids).logits, model(ids, attention="quadratic").logits, **TOL)
    assert model.encoder.cfg.causal is False and len(model.encoder.units) == 4


@pytest.mark.parametrize("overrides, message", [
    (dict(scoring="relu2"), "scoring applies only with causal false \\(this run has causal true\\), got 'relu2'; "
                            "leave it out \\(a language model is causal; an encoder classifier trains with tvq "
                            "classify train\\)$"),  # a language model's causal is fixed: setting it is not offered
    (dict(scoring="relu2", n_classes=2), "got 'relu2'; leave it out, or set causal as it needs$"),
    (dict(causal=False), "causal false is an encoder's, and an encoder is a classifier \\(n_classes > 0; tvq classify "
                         "train\\): a language model \\(n_classes 0\\) is causal$"),
    (dict(norm="group"), "norm must be one of layer, batch, scale"),
    (dict(ema_dim=0), "ema_dim must be a positive integer"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        LongVQConfig(**overrides)


def test_config_round_trips_and_presets():
    cfg = longvq_preset("tiny", n_classes=4, causal=False, scoring="relu2", norm="batch")
    assert LongVQConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(n_layers=3).n_layers == 3 and cfg.n_layers == 2
    with pytest.raises(ConfigError, match="unknown model config key"):
        LongVQConfig.from_dict({"n_head": 2})
    with pytest.raises(ConfigError, match="unknown LongVQ lm preset 'lra'; available: enwik8, tiny, small"):
        longvq_preset("lra")
    # `small` is a preset of each task, of a different size: the one of tvq train --arch longvq, of tvq classify train
    assert longvq_preset("small") == LONGVQ_LM_PRESETS["small"] and LONGVQ_LM_PRESETS["small"].d_model == 256
    assert longvq_preset("small", "classify", n_classes=3) == CLASSIFY_PRESETS["small"].replace(n_classes=3)
    # left out, the task is the one the overrides build: a classifier's small, not the language model's (13x larger)
    assert longvq_preset("small", n_classes=3) == CLASSIFY_PRESETS["small"].replace(n_classes=3)
    assert longvq_preset("small", n_classes=2, causal=False).d_model == CLASSIFY_PRESETS["small"].d_model == 64
    assert longvq_preset("small", "lm", n_classes=3).d_model == 256  # a task given is the task taken
    with pytest.raises(ConfigError, match="task must be 'lm' or 'classify', got 'lra'"):
        longvq_preset("small", task="lra")
    enwik8 = longvq_preset("enwik8")  # Table 8
    assert (enwik8.d_model, enwik8.d_ffn, enwik8.d_qk, enwik8.d_v, enwik8.ema_dim, enwik8.n_layers,
            enwik8.n_code, enwik8.dropout) == (512, 1024, 128, 1024, 16, 12, 512, 0.1)


def test_model_input_errors():
    model = classifier()
    with pytest.raises(ValueError, match=r"ids holds token id 256, outside the vocabulary \[0, 256\)"):
        model(torch.tensor([[256]]))
    with pytest.raises(ValueError, match=r"mask must be a bool or integer \(0/1\) tensor of the shape of ids"):
        model(torch.tensor([[1, 2]]), mask=torch.tensor([[1.0, 1.0]]))
    causal = classifier(causal=True)
    with pytest.raises(ValueError, match="a causal model takes trailing padding only"):
        causal(torch.tensor([[1, 2]]), mask=torch.tensor([[False, True]]))
    with pytest.raises(ValueError, match="a language model needs n_classes 0 and causal true"):
        LongVQLM(longvq_preset("tiny", **CLASSIFIER))
    for kind in (LongVQClassifier, TransformerClassifier, TransformerVQEncoderClassifier):
        with pytest.raises(ValueError, match=r"a classifier needs n_classes >= 1, got 0 \(n_classes 0 is a language"):
            kind(longvq_preset("tiny"))
    with pytest.raises(ValueError, match="d_model must be even and divisible by d_qk, got d_model=32, d_qk=12"):
        TransformerClassifier(longvq_preset("tiny", d_qk=12, **CLASSIFIER))


@pytest.mark.parametrize("kind", [LongVQClassifier, TransformerClassifier, TransformerVQEncoderClassifier])
@pytest.mark.parametrize("shape", [(0, 5), (2, 0)], ids=["empty-batch", "empty-sequences"])
def test_an_empty_batch_or_sequence_is_refused_by_every_classifier(kind, shape):
    model = kind(longvq_preset("tiny", **CLASSIFIER))
    with pytest.raises(ValueError) as err:
        model(torch.zeros(shape, dtype=torch.long))
    assert str(err.value) == (f"ids must be a [batch, length] int64 tensor with batch >= 1 and length >= 1, got "
                              f"{shape} torch.int64")



def test_language_model_refuses_targets_of_another_shape():
    """One target per input position, checked before the forward (cross-entropy raised a bare RuntimeError)."""
    model = LongVQLM(longvq_preset("tiny"))
    ids = torch.zeros(2, 10, dtype=torch.long)
    with pytest.raises(ValueError, match=r"targets must have the shape of ids \(2, 10\) \(one target per input "
                                         r"position\), got \(2, 9\)"):
        model(ids, targets=ids[:, :9])


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_a_language_model_with_low_precision_parameters_trains_and_decodes(low):
    """``LongVQLM(...).to(bfloat16)`` (not autocast): the SSM inside computes in float32 from the rounded parameters
    (its own test), so the model trains, decodes, and its loss is the float32 model's to the low precision's steps."""
    torch.manual_seed(0)
    model = LongVQLM(longvq_preset("tiny", block_len=4, n_code=6)).to(low)
    exact = LongVQLM(longvq_preset("tiny", block_len=4, n_code=6)).float()
    exact.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ids = torch.randint(0, 16, (2, 17), generator=torch.Generator().manual_seed(1))
    out = model(ids[:, :-1], targets=ids[:, 1:])
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    with torch.no_grad():
        want = exact(ids[:, :-1], targets=ids[:, 1:]).loss
    assert abs(out.loss.item() - want.item()) < 0.02 * want.item()
    assert model.eval().generate(ids[:, :5], max_new_tokens=6).shape == (2, 11)


def test_batch_norm_refuses_one_real_token_in_training_by_name():
    """Batch statistics of one token are undefined: torch's own "Expected more than 1 value per channel" named neither
    the norm nor the batch; evaluation (running statistics) takes a single token."""
    norm = SequenceNorm("batch", 4).train()
    for x, mask in ((torch.randn(1, 1, 4), None), (torch.randn(1, 3, 4), torch.tensor([[True, False, False]]))):
        with pytest.raises(ValueError, match=r"^norm 'batch' takes the statistics of the batch's real tokens in "
                                             r"training, and this call has 1"):
            norm(x, mask)
    assert norm.eval()(torch.randn(1, 1, 4)).shape == (1, 1, 4)


@pytest.mark.parametrize("kind", [TransformerClassifier, TransformerVQEncoderClassifier])
def test_the_baselines_refuse_fields_they_would_ignore(kind):
    """causal, scoring and norm configure LongVQ; a baseline built from Python ignored them (a "causal" config built
    an encoder), where tvq classify train refuses them as flags."""
    for change, message in ((dict(causal=True), r"baseline is an encoder: build it from a config with causal=False"),
                            (dict(scoring="relu2"), r"and the config asks for scoring='relu2'"),
                            (dict(norm="scale"), r"and the config asks for norm='scale'")):
        with pytest.raises(ValueError, match=message):
            kind(longvq_preset("tiny", **{**CLASSIFIER, **change}))
    if kind is TransformerVQEncoderClassifier:  # named as the LongVQConfig written, not the one built from it
        with pytest.raises(ValueError, match=r"^the Transformer-VQ encoder baseline cannot be built from this "
                                             r"LongVQConfig: d_model must be even"):
            kind(longvq_preset("tiny", **{**CLASSIFIER, "d_model": 33}))
