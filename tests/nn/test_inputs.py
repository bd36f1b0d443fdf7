"""What every model refuses of a call, before any work, and what it does with padding (``models/inputs.py``).

Found by a new user's audit: a causal Transformer-VQ attended left padding as if it were text (logits moved by the
padding's content), a state of another model was continued without a word, and an empty batch, a mask of the wrong
shape or dtype, or a float ``max_new_tokens`` ended in torch's or Python's own errors.
"""

from __future__ import annotations

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import LongVQConfig
from transformer_vq.models.longvq.model import LongVQClassifier, LongVQLM
from transformer_vq.nn.state import ModelState

B, T, L = 2, 12, 4


def tvq(attn_type="vq", n_layers=1, causal=True):
    torch.manual_seed(0)
    return TransformerVQ(preset("tiny", n_layers=n_layers, block_len=L, n_code=6, attn_type=attn_type,
                                causal=causal)).double().eval()


def longvq_lm(n_layers=1):
    torch.manual_seed(0)
    cfg = LongVQConfig(vocab_size=256, d_model=16, d_qk=8, d_v=16, n_layers=n_layers, block_len=L, n_code=6,
                       n_classes=0, causal=True)
    return LongVQLM(cfg).double().eval()


def ids(seed=1, shape=(B, T)):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


def trailing_mask(real=(T, 7)):
    return torch.arange(T).expand(B, T) < torch.tensor(real)[:, None]


@pytest.mark.parametrize("attn_type", ["vq", "full", "flash"])
def test_a_causal_model_refuses_padding_before_real_tokens(attn_type):
    mask = ~trailing_mask((0, 3))  # left padding: row 1's first 3 positions
    mask[0] = True
    with pytest.raises(ValueError, match=r"^a causal model takes trailing padding only, and mask has a real token "
                                         r"after a padding token: .*pad rows of different lengths on the right"):
        tvq(attn_type)(ids(), mask=mask)


def test_the_left_padding_refusal_names_what_each_family_has():
    """Transformer-VQ's refusal points to its Hugging Face model, which runs left-padded rows; LongVQ has none, and
    its refusal said to use it."""
    mask = ~trailing_mask((0, 3))
    mask[0] = True
    with pytest.raises(ValueError, match=r"on the right, or, to generate from left-padded prompts, use the Hugging "
                                         r"Face model \(docs/huggingface.md\)"):
        tvq("vq")(ids(), mask=mask)
    with pytest.raises(ValueError, match=r"on the right, or run each prompt alone$"):
        longvq_lm().backbone(ids(), mask=mask)  # the LM takes no mask; its backbone (a causal classifier's) does


@pytest.mark.parametrize("attn_type", ["vq", "full", "flash"])
def test_trailing_padding_changes_no_real_token_and_its_state_is_not_continued(attn_type):
    model, mask = tvq(attn_type), trailing_mask()
    x, other = ids(1), ids(2)
    x2 = torch.where(mask, x, other)  # the padding's content changed, the real tokens kept
    out = model(x, mask=mask)
    torch.testing.assert_close(model(x2, mask=mask).logits[mask], out.logits[mask], rtol=0, atol=0)
    torch.testing.assert_close(out.logits[1, :7], model(x[1:, :7]).logits[0], rtol=1e-12, atol=1e-12)
    assert out.state.padded and not model(x).state.padded
    assert out.state.detach().padded
    with pytest.raises(ValueError, match=r"^state was returned by a call whose mask held padding"):
        model(x[:, :1], out.state)


def test_a_state_of_another_model_is_refused():
    one, two = tvq(n_layers=1), tvq(n_layers=2)
    x = ids()
    state = two(x).state
    with pytest.raises(ValueError, match=r"^state holds the states of 4 layers and this TransformerVQ has 2: it was "
                                         r"returned by another model"):
        one(x, state)
    with pytest.raises(ValueError, match=r"^state holds the states of 2 layers and this TransformerVQ has 4"):
        two(x, one(x).state)
    with pytest.raises(ValueError, match=r"^state must be the ModelState that a previous call of this TransformerVQ "
                                         r"returned \(or None\), got list"):
        one(x, state.layers)
    lm1, lm2 = longvq_lm(1), longvq_lm(2)
    with pytest.raises(ValueError, match=r"^state holds the states of 2 layers and this LongVQ model has 1"):
        lm1(x, lm2(x).state)


@pytest.mark.parametrize("make", [tvq, longvq_lm], ids=["tvq", "longvq"])
def test_bad_ids_masks_and_lengths_are_refused_by_name(make):
    model = make()
    name = "input_ids" if make is tvq else "ids"
    x = ids()
    with pytest.raises(ValueError, match=rf"^{name} must be a \[batch, length\] int64 tensor with batch >= 1 and "
                                         rf"length >= 1, got \(0, 12\) torch.int64$"):
        model(x[:0])
    with pytest.raises(ValueError, match=rf"^{name} must be a \[batch, length\] int64 tensor .* got \(2, 12\) "
                                         rf"torch.float32$"):
        model(x.float())
    for bad, got in ((torch.ones(B, T - 1, dtype=torch.bool), r"torch.bool \[2, 11\]"),
                     (torch.ones(B, T), r"torch.float32 \[2, 12\]"), (torch.ones(T, dtype=torch.bool),
                                                                    r"torch.bool \[12\]")):
        with pytest.raises(ValueError, match=rf"^loss_mask must be a bool or integer \(0/1\) tensor of the shape of "
                                             rf"{name} \[2, 12\], got {got}$"):
            model(x, targets=x, loss_mask=bad)
    with pytest.raises(ValueError, match=r"^max_new_tokens must be an integer >= 0, got 2.5$"):
        model.generate(x, 2.5)


def test_refusals_of_what_hugging_face_users_write_say_the_native_way():
    """-100 in native targets (Hugging Face's "no target") names loss_mask; left padding names right padding and
    the Hugging Face model, which runs left-padded prompts."""
    model, x = tvq(), ids()
    targets = x.clone()
    targets[:, :3] = -100
    with pytest.raises(ValueError, match=r"^targets holds token id -100, outside the vocabulary \[0, 256\); -100 marks "
                                         r"a position without a target in Hugging Face's labels; here give any id "
                                         r"there and loss_mask False$"):
        model(x, targets=targets)
    left = trailing_mask().flip(-1)
    with pytest.raises(ValueError, match=r"pad rows of different lengths on the right, or, to generate from "
                                         r"left-padded prompts, use the Hugging Face model \(docs/huggingface.md\)"):
        model(x, mask=left)


def test_numpy_and_zero_dim_torch_integers_are_integers():
    """``generate(ids, np.int64(n))``, a quantizer's or operator's size from numpy: integers, as Python's are
    (a bool or a float is still refused)."""
    import numpy as np

    from transformer_vq import VectorQuantizer, vq_attention_naive

    model, x = tvq(), ids()
    for n in (np.int64(2), torch.tensor(2), np.int32(2)):
        assert model.generate(x, n, temperature=0.0).shape == (B, T + 2)
    with pytest.raises(ValueError, match=r"^max_new_tokens must be an integer >= 0, got True$"):
        model.generate(x, True)
    assert VectorQuantizer(1, np.int64(4), 4, dead_code_restart=np.int64(3)).dead_code_restart == 3
    q = torch.randn(1, 1, 4, 2, dtype=torch.float64)
    assert vq_attention_naive(q, q, q, torch.zeros(1, 1, 4, 4, dtype=torch.float64), block_len=np.int64(2)).shape \
        == (1, 1, 4, 2)


def test_tvq_refuses_a_floating_mask_by_name():
    """A floating mask could be weights, or an additive mask (0 at real tokens) that would read inverted."""
    with pytest.raises(ValueError, match=r"^mask must be a bool or integer \(0/1\) tensor of the shape of input_ids "
                                         r"\[2, 12\], got torch.float32 \[2, 12\]$"):
        tvq()(ids(), mask=torch.ones(B, T))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_an_integer_mask_is_the_bool_mask(dtype):
    """0/1 masks as tokenizers return them: every model and layer gives the bool mask's outputs, bit for bit."""
    x, mask = ids(), trailing_mask()
    cfg = LongVQConfig(vocab_size=256, d_model=16, d_qk=8, d_v=16, n_layers=1, block_len=L, n_code=6, n_classes=3,
                       causal=False)
    for model in (tvq(), tvq(causal=False), LongVQClassifier(cfg), longvq_lm()):
        model.eval()
        call = (lambda m: model(x, targets=x, loss_mask=m)) if isinstance(model, LongVQLM) else \
            (lambda m: model(x, mask=m))
        want, got = call(mask), call(mask.to(dtype))
        assert torch.equal(want.logits, got.logits) and (want.loss is None or torch.equal(want.loss, got.loss))


def test_longvq_classifier_mask_padding_is_still_refused_before_real_tokens():
    cfg = LongVQConfig(vocab_size=256, d_model=16, d_qk=8, d_v=16, n_layers=1, block_len=L, n_code=6, n_classes=3,
                       causal=True)
    mask = trailing_mask()
    mask[0, 2] = False
    with pytest.raises(ValueError, match=r"^a causal model takes trailing padding only"):
        LongVQClassifier(cfg)(ids(), mask=mask)
    assert ModelState(0, []).padded is False


def test_layers_and_references_refuse_bad_input_by_name():
    """The exported building blocks check what they are given: a wrong width, a ``[T]`` mask, a quantizer of no
    codes or a diverging EMA rate, a reference at ``block_len=0`` (once a ZeroDivisionError) or of the wrong rank."""
    from transformer_vq import GatedAttentionUnit, VectorQuantizer, vq_attention_naive
    from transformer_vq.ops.flash.naive import flash_attention_naive
    from transformer_vq.ops.vq_bidir.naive import vq_bidir_attention_naive

    unit = GatedAttentionUnit(preset("tiny"))
    with pytest.raises(ValueError, match=r"^x must be a floating \[batch, length, 32\] tensor .* got \(2, 5, 31\)"):
        unit(torch.randn(2, 5, 31))
    with pytest.raises(ValueError, match=r"^mask must be a bool or integer \(0/1\) tensor of the shape of x's \[B, T\] "
                                         r"\[2, 5\], got torch.bool \[5\]$"):
        unit(torch.randn(2, 5, 32), mask=torch.ones(5, dtype=torch.bool))
    for kwargs, message in ((dict(n_code=0), r"^n_code must be a positive integer, got 0"),
                            (dict(ema_rate=2.0), r"^ema_rate must be in \(0, 1\), got 2.0"),
                            (dict(dead_code_restart=-1), r"^dead_code_restart must be an integer >= 0")):
        with pytest.raises(ValueError, match=message):
            VectorQuantizer(**{"n_group": 1, "n_code": 4, "dim": 4, **kwargs})
    with pytest.raises(ValueError, match=r"^k must be a floating \[B, G, T, D\] = \[B, 1, T, 4\] tensor, got "
                                         r"\(2, 1, 5, 3\) torch.float32$"):
        VectorQuantizer(1, 4, 4)(torch.randn(2, 1, 5, 3))
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"^block_len must be a positive integer, got 0"):
        vq_attention_naive(q, q, q, torch.zeros(1, 1, 4, 0), block_len=0)
    with pytest.raises(ValueError, match=r"^bias must be \[B, H, T, 2L\] = \[1, 1, 4, 4\]"):
        vq_attention_naive(q, q, q, torch.zeros(1, 1, 4, 3), block_len=2)
    with pytest.raises(ValueError, match=r"^chunk_len must be a positive integer, got 0"):
        flash_attention_naive(q, q, q, torch.zeros(1, 1, 4, 4), block_len=2, chunk_len=0)
    with pytest.raises(ValueError, match=r"^mask must be a bool tensor of the shape of the queries' \[B, T\] \[1, 4\]"):
        vq_bidir_attention_naive(q, q, q, block_len=2, mask=torch.ones(4, dtype=torch.bool))
