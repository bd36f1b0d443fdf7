"""What a unit holds between evaluation calls (the relative-position table, quantized queries' code-pair table) follows
its weights' values, however they change: an optimizer step, FSDP2's all-gather into the same memory with the version
counter kept, ``p.data`` writes, a loaded state dict. Each case is compared exactly (float64) with a fresh model that
never held anything. And unchanged weights are not re-projected: decoding pays for the table once."""

from __future__ import annotations

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.nn.held import HeldValue


def tiny(**overrides) -> TransformerVQ:
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, **overrides)).to(torch.float64).eval()
    with torch.no_grad():
        for unit in model.units:
            unit.v_r.normal_()  # zero at init: the bias would not depend on W_r
            unit.u.normal_()
    return model


def logits(model: TransformerVQ, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def fsdp_like_write(param: torch.Tensor, values: torch.Tensor) -> None:
    """What FSDP2's all-gather copy-out does to an unsharded parameter: new values in the same memory, the version
    counter unchanged (torch.distributed.fsdp._fully_shard._fsdp_param_group.wait_for_unshard)."""
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(param):
        param.copy_(values)


def data_write(param: torch.Tensor, values: torch.Tensor) -> None:
    param.data.copy_(values)  # .data writes bypass the version counter


def state_dict_load(param: torch.Tensor, values: torch.Tensor, model: TransformerVQ) -> None:
    name = next(n for n, p in model.named_parameters() if p is param)
    model.load_state_dict({**model.state_dict(), name: values})


WRITES = {"fsdp-all-gather": fsdp_like_write, "data": data_write, "load_state_dict": state_dict_load}


def write(how: str, param: torch.Tensor, values: torch.Tensor, model: TransformerVQ) -> None:
    pointer, version = param.data_ptr(), param._version
    if how == "load_state_dict":
        state_dict_load(param, values, model)
    else:
        WRITES[how](param, values)
    if how != "load_state_dict":  # the cases a (version, address) key cannot see
        assert (param.data_ptr(), param._version) == (pointer, version)


@pytest.mark.parametrize("how", WRITES)
@pytest.mark.parametrize("kind", ["vq", "vq_qk"])
def test_held_tables_follow_the_weights(kind, how):
    overrides = {"vq": {}, "vq_qk": dict(quantize_queries=True)}[kind]
    model = tiny(**overrides)
    ids = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(1))
    logits(model, ids)  # the tables are held from here
    changed = [model.units[0].w_r.weight, model.units[1].w_r.weight]
    if kind == "vq_qk":
        changed.append(model.units[0].u)  # the code-pair table's content bias
    for param in changed:
        write(how, param, param + 0.1 * torch.randn_like(param), model)
    fresh = tiny(**overrides)  # has never run: holds nothing
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(logits(model, ids), logits(fresh, ids), rtol=0, atol=0)
    assert not torch.equal(logits(model, ids), logits(tiny(**overrides), ids))  # the writes took effect


def test_unchanged_weights_are_not_projected_again():
    model = tiny()
    calls = []
    model.units[0].w_r.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    first = logits(model, ids)
    for _ in range(3):
        torch.testing.assert_close(logits(model, ids), first, rtol=0, atol=0)
    assert len(calls) == 1
    model.train()
    model(ids)  # training re-projects every call (sinusoid dropout, gradients) and holds nothing new
    model.eval()
    logits(model, ids)
    assert len(calls) == 2  # the training call projected; the held table still serves evaluation after it


def test_held_value_rebuilds_on_any_change_of_its_sources():
    held, builds = HeldValue(), []

    def build():
        builds.append(1)
        return len(builds)

    a = torch.tensor([1.0, 2.0])
    assert held.get([a], key="x", build=build) == 1
    assert held.get([a.clone()], key="x", build=build) == 1  # equal values: held, wherever they live
    assert held.get([a], key="y", build=build) == 2  # another key
    a.data[0] = 5.0  # no version bump, same address
    assert held.get([a], key="y", build=build) == 3
    assert held.get([a.double()], key="y", build=build) == 4  # another dtype, equal values
    assert held.get([a.double(), a], key="y", build=build) == 5  # more sources
    nan = torch.tensor([float("nan")])
    assert held.get([nan], key="y", build=build) == 6
    assert held.get([nan], key="y", build=build) == 7  # NaN equals nothing: never served stale
    held.clear()
    assert held.get([a], key="y", build=build) == 8


@pytest.mark.parametrize("first", ["bfloat16", "float32"])
def test_a_held_table_is_not_served_across_an_autocast_switch(first):
    """A table built inside ``torch.autocast`` is bfloat16 arithmetic: a float32 call after it (and an autocast call
    after a float32 one) builds its own, so each equals what a model that never held anything returns."""
    torch.manual_seed(0)
    fresh = TransformerVQ(preset("tiny", n_layers=2, block_len=4, quantize_queries=True)).eval()
    with torch.no_grad():
        for unit in fresh.units:
            unit.v_r.normal_()
            unit.u.normal_()
    used = TransformerVQ(fresh.cfg).eval()
    used.load_state_dict(fresh.state_dict())
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))  # past the 2L = 8 window

    def call(model, dtype):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            return model(ids).logits

    second = "float32" if first == "bfloat16" else "bfloat16"
    call(used, first)
    torch.testing.assert_close(call(used, second), call(fresh, second), rtol=0, atol=0)
