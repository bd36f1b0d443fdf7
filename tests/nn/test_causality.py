"""Every causal configuration of every language-model architecture is causal: changing the tokens after position
``t`` leaves every output at positions ``<= t`` unchanged (float64, to 1e-12), in training and evaluation mode, with
the linear-time and the dense attention.

The configurations are enumerated from the config classes themselves (every field with ``choices`` and every bool
field), so a choice added to a config is tested without touching this file: the full product of the choice fields
(architecture x norm x scoring x head type x attention type x ...), with the bool fields assigned so that every pair
of values of any two fields that some valid configuration holds appears at least once (a pairwise covering). A
configuration the config refuses is not a causal configuration; what cannot be causal must be refused there (the
test of ``norm='batch'`` below).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from transformer_vq.config import ConfigError, LongVQConfig
from transformer_vq.config.arch import ARCHS
from transformer_vq.config.fields import kinds
from transformer_vq.train.models import instantiate

EXACT = dict(rtol=0.0, atol=1e-12)  # float64: the outputs at <= t must not depend on later tokens at all
LENGTH, BLOCK_LEN = 13, 4  # three blocks and a piece: the window, the compressive cache and a ragged tail
CHANGED_AFTER = (0, 5, 11)  # one sequence of the batch per t: a mix across the batch shows up too
SIZES = dict(block_len=BLOCK_LEN, n_code=5, n_layers=2)
NOT_ON_CPU = {"attn_backend": ("triton",)}
"""Values that run on CUDA in float32 only; tests/ops/vq/test_vq_triton.py shows the Triton backend equals the eager
operator, which this test checks."""
FIXED = {"causal": True}


def axes(cls) -> dict[str, tuple]:
    """Every field of ``cls`` with a finite set of values: its ``choices``, or false/true."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in FIXED:
            continue
        if "choices" in f.metadata:
            out[f.name] = tuple(v for v in f.metadata["choices"] if v not in NOT_ON_CPU.get(f.name, ()))
        elif kinds(cls)[f.name].base is bool:
            out[f.name] = (False, True)
    return out


def valid(base, values: dict):
    try:
        return base.replace(**values, **FIXED)
    except ConfigError:
        return None


def pairs(values: dict) -> set:
    return {((a, values[a]), (b, values[b])) for a, b in itertools.combinations(sorted(values), 2)}


def configurations(arch) -> list:
    """The full product of ``arch``'s choice fields, each with the bool fields that cover the most pairs of values
    not covered yet, then one configuration for each pair still missing that a valid configuration holds."""
    base = arch.presets["tiny"].replace(**SIZES)
    fields = axes(arch.config)
    choice = [n for n in fields if not isinstance(fields[n][0], bool)]
    every = [dict(zip(fields, v)) for v in itertools.product(*fields.values())]
    every = [(v, cfg) for v in every if (cfg := valid(base, v)) is not None]
    wanted = set().union(*(pairs(v) for v, _ in every))
    chosen, covered = [], set()
    for picked in itertools.product(*(fields[n] for n in choice)):
        options = [(v, cfg) for v, cfg in every if all(v[n] == p for n, p in zip(choice, picked))]
        if options:
            v, cfg = max(options, key=lambda o: len(pairs(o[0]) - covered))
            chosen.append((v, cfg))
            covered |= pairs(v)
    for v, cfg in every:
        if pairs(v) - covered:
            chosen.append((v, cfg))
            covered |= pairs(v)
    assert covered == wanted
    return [pytest.param(arch, cfg, id=f"{arch.name}-" + "-".join(f"{n}={v[n]}" for n in fields))
            for v, cfg in chosen]


CASES = [case for arch in ARCHS if arch.task == "lm" for case in configurations(arch)]


def perturbed(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` with every token after ``CHANGED_AFTER[i]`` of sequence ``i`` replaced."""
    out = ids.clone()
    for i, t in enumerate(CHANGED_AFTER):
        out[i, t + 1:] = (ids[i, t + 1:] + 1 + i) % 256
    return out


def with_dropout(cfg):
    """Every dropout of ``cfg`` on, so training mode draws masks (the same ones for both inputs: same seed)."""
    rates = {f.name: 0.3 for f in dataclasses.fields(cfg) if f.name.startswith("drop")}
    return cfg.replace(**rates)


@pytest.mark.parametrize("arch, cfg", CASES)
def test_outputs_at_t_do_not_depend_on_later_tokens(arch, cfg):
    torch.manual_seed(0)
    model = instantiate(arch, with_dropout(cfg)).double()
    ids = torch.randint(0, 256, (len(CHANGED_AFTER), LENGTH), generator=torch.Generator().manual_seed(1))
    other = perturbed(ids)
    # the dense reference exists for VQ attention (the baselines are their own dense formulas)
    attentions = ("linear", "quadratic") if getattr(cfg, "attn_type", "vq") == "vq" else ("linear",)
    for training, attention in itertools.product((True, False), attentions):
        model.train(training)
        outputs = []
        for x in (ids, other):
            torch.manual_seed(2)  # the same dropout masks for both inputs
            outputs.append(model(x, attention=attention).logits)
        for i, t in enumerate(CHANGED_AFTER):
            torch.testing.assert_close(outputs[1][i, :t + 1], outputs[0][i, :t + 1], **EXACT,
                                       msg=lambda m: f"training={training}, attention={attention}, t={t}: {m}")
        assert not torch.equal(outputs[0], outputs[1])  # the change reached the later outputs


def test_the_enumeration_reaches_every_choice_of_every_architecture():
    for arch in ARCHS:
        if arch.task != "lm":
            continue
        seen = {}
        for case in CASES:
            if case.values[0] is arch:
                for name in axes(arch.config):
                    seen.setdefault(name, set()).add(getattr(case.values[1], name))
        for name, values in axes(arch.config).items():
            assert seen[name] == {v for v in values if valid(arch.presets["tiny"], {name: v}) is not None}, name


def test_a_normalization_over_time_is_refused_for_a_causal_model():
    with pytest.raises(ConfigError) as caught:
        LongVQConfig(norm="batch", causal=True, n_classes=2)
    assert caught.value.problems == (("norm", "'batch' mixes the positions of a sequence (its statistics are taken "
                                               "over time), so a causal model would see later tokens: use norm "
                                               "'layer' or 'scale', or causal false for an encoder"),)
    with pytest.raises(ConfigError) as caught:  # a language model cannot be made an encoder: not offered
        LongVQConfig(norm="batch", causal=True)
    assert caught.value.problems == (("norm", "'batch' mixes the positions of a sequence (its statistics are taken "
                                               "over time), so a causal model would see later tokens: use norm "
                                               "'layer' or 'scale' (a language model is causal; an encoder "
                                               "classifier trains with tvq classify train)"),)
    assert LongVQConfig(norm="batch", causal=False, n_classes=2).norm == "batch"
