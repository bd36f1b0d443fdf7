"""FSDP2 finds the tensors of what every sharded module returns, in every torch release.

FSDP2 gathers a sharded module's parameters again for its backward from hooks on the tensors of the module's output.
Before torch 2.13 it looked for them with ``tree_flatten``, which saw a dataclass as one opaque leaf: the units'
parameters stayed freed and the first backward failed ("setStorage ... storage of size 0"; seen with torch 2.11 on an
H100). The output dataclasses are pytree nodes now (``transformer_vq.nn.outputs``); these tests hold every torch
release to that, the last one by giving this torch's FSDP2 the old way of looking.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest
import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

import transformer_vq
from transformer_vq import TransformerVQ, preset
from transformer_vq.config import longvq_preset
from transformer_vq.models.longvq.model import LongVQClassifier, LongVQLM
from transformer_vq.train.parallel.fsdp import shard_model, sharding_units

OPTIONAL = ("transformer_vq.hf", "transformer_vq.ops.vq.triton")
"""Packages that need an optional dependency (an extra); they return no module outputs of their own."""


def library_modules():
    for info in pkgutil.walk_packages(transformer_vq.__path__, "transformer_vq."):
        if not info.name.startswith(OPTIONAL) and not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def test_every_output_dataclass_is_a_pytree_node():
    outputs = {obj for module in library_modules() for name, obj in vars(module).items()
               if isinstance(obj, type) and dataclasses.is_dataclass(obj) and name.endswith("Output")
               and obj.__module__.startswith("transformer_vq.")}
    assert len(outputs) >= 5, outputs  # GAU, LongVQ layer, model, classifier, ragged outputs
    missing = sorted(cls.__qualname__ for cls in outputs if cls not in pytree.SUPPORTED_NODES)
    assert not missing, f"output dataclasses torch's tree_flatten cannot see into: {missing}"
    # keyed too: tree_flatten_with_path (torch.export's) names each leaf by its field; it raised once registered
    out = TransformerVQ(preset("tiny"))(torch.zeros(1, 3, dtype=torch.long))
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(out)[0]]
    assert paths == [".logits", ".state", ".commit_loss", ".ce_loss", ".loss"]


def models():
    torch.manual_seed(0)
    classify = dict(n_classes=3, causal=False, block_len=4, n_code=6)
    return {"tvq": TransformerVQ(preset("tiny")), "longvq-lm": LongVQLM(longvq_preset("tiny", block_len=4, n_code=6)),
            "longvq-classifier": LongVQClassifier(longvq_preset("tiny", **classify))}


def run(model, ids):
    if isinstance(model, LongVQClassifier):
        return model(ids, labels=torch.tensor([0, 2])).loss
    return model(ids[:, :-1], targets=ids[:, 1:]).loss


@pytest.mark.parametrize("name", ["tvq", "longvq-lm", "longvq-classifier"])
def test_each_sharded_units_output_flattens_to_the_tensors_its_backward_starts_from(name):
    model = models()[name].train()
    seen = []
    for unit in sharding_units(model):
        unit.register_forward_hook(lambda module, args, output: seen.append(output))
    run(model, torch.randint(0, 16, (2, 17)))
    assert len(seen) == len(sharding_units(model))
    for output in seen:
        leaves = pytree.tree_flatten(output)[0]
        assert any(leaf is output.x for leaf in leaves)


@pytest.fixture
def old_fsdp_lookup(monkeypatch):
    """This torch's FSDP2 looking for a module's output tensors as torch 2.11 does (``tree_flatten``)."""
    state = pytest.importorskip("torch.distributed.fsdp._fully_shard._fsdp_state")
    if hasattr(state, "collect_grad_tensors"):  # torch >= 2.13; older releases already look the old way
        monkeypatch.setattr(state, "collect_grad_tensors", lambda output: tuple(
            t for t in pytree.tree_flatten(output)[0] if torch.is_tensor(t) and t.requires_grad))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tvq", "longvq-lm", "longvq-classifier"])
def test_a_sharded_model_runs_its_backward_as_older_torch_finds_outputs(name, old_fsdp_lookup):
    plain, sharded = models()[name].train(), models()[name].train()
    shard_model(sharded, "float32")
    ids = torch.randint(0, 16, (2, 17), generator=torch.Generator().manual_seed(1))
    run(plain, ids).backward()
    run(sharded, ids).backward()  # failed on an empty storage before the outputs were pytree nodes
    for (label, p), q in zip(sharded.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-6, atol=1e-7, msg=label)
