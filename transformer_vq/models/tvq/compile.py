"""``torch.compile`` of the gated attention units (``tvq train --torch-compile``).

Eagerly, the operator is a chain of elementwise passes over ``T x (S + 2L)`` scores (bias add, mask, exponent,
normalizer) between its matmuls, and the unit adds its own (norms, SiLU, gate, straight-through estimator): each pass
reads and writes the whole tensor. Compiled, each unit's forward becomes one graph whose elementwise chains are fused
into loops around the matmuls, forward and backward. The units are compiled one by one, not the model: the model's
input checks read token ids on the host (a graph break), while a causal unit's forward traces whole. An encoder's
unit (``causal=False``, ``vq``) breaks once per call: whether the window bias reaches below ``-CORRECTION_LIMIT``
picks one of two exact paths (``ops/vq_bidir/attention.py``), a value read on the host; the numbers equal eager's.

Recompiles are bounded. Every unit shares one compiled code object (the modules' weights are graph inputs, not
constants). A graph is specialized on whether a state is carried (the first window of a batch has none), on grad mode
(training vs evaluation), and first on the exact length and offset of the call; when a later call differs in those,
``torch.compile``'s automatic dynamic shapes recompile once with them symbolic, and that graph serves every later
length and offset. So training windows settle after at most three graphs; tests/models/tvq/test_compile.py counts them.
"""

from __future__ import annotations

from torch import nn

from transformer_vq.models.tvq.gau import GatedAttentionUnit


def compile_units(model: nn.Module, *, backend="inductor") -> int:
    """Compile, in place, the forward of every :class:`GatedAttentionUnit` in ``model``; returns how many.

    Weights, buffers and state dicts are unchanged (``nn.Module.compile`` wraps the call, not the module), so
    checkpoints of a compiled run load into a plain model. ``backend``: any ``torch.compile`` backend (tests count
    compilations with a counting one).
    """
    units = [module for module in model.modules() if isinstance(module, GatedAttentionUnit)]
    if not units:
        raise ValueError(f"compile_units: {type(model).__name__} holds no GatedAttentionUnit to compile")
    for unit in units:
        unit.compile(backend=backend)
    return len(units)

