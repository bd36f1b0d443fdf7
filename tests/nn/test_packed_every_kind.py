"""Every attention kind the model offers takes packed documents, or refuses them in words the docs carry.

The kinds are not listed by hand: every combination of the config's choices (``ATTN_TYPES``, ``causal``,
``quantize_queries``, ``compressive_cache``, ``ATTN_BACKENDS``, ``abs_pos``) that ``preset`` accepts is run, with the
documents given either way (``position_ids``, ``cu_seqlens``), so a kind added
later is held to packing from its first commit. The same packed batch (documents on block edges, and one of a single
token at the end of a row) must give each document exactly what it gets alone, logits and every parameter gradient;
a kind that cannot must raise a ``ValueError`` whose message is quoted in docs/operator.md or docs/training.md.
The Triton kind is marked ``slow`` on a CPU (``pytest -m slow``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.config import ATTN_BACKENDS, ATTN_TYPES, ConfigError

L = 4
DOCS = Path(__file__).resolve().parents[2] / "docs"


def every_kind():
    """``(id, overrides)`` of every configuration of the attention that the config accepts."""
    axes = dict(attn_type=ATTN_TYPES, causal=(True, False), quantize_queries=(False, True),
                compressive_cache=(True, False), attn_backend=ATTN_BACKENDS, abs_pos=(False, True))
    for values in itertools.product(*axes.values()):
        overrides = dict(zip(axes, values))
        try:
            preset("tiny", block_len=L, **overrides)
        except ConfigError:
            continue
        name = "-".join([overrides["attn_type"], "causal" if overrides["causal"] else "encoder",
                         *(["qk"] if overrides["quantize_queries"] else []),
                         *([] if overrides["compressive_cache"] else ["window"]), overrides["attn_backend"],
                         *(["abs"] if overrides["abs_pos"] else [])])
        # the fused kernels under Triton's interpreter take a minute here; their packing is tested on the operator
        # (tests/ops/vq/test_vq_triton_documents.py) by default
        slow = overrides["attn_backend"] == "triton" and not torch.cuda.is_available()
        yield pytest.param(overrides, id=name, marks=[pytest.mark.slow] if slow else [])


def kind_model(overrides):
    torch.manual_seed(0)
    # flash's chunks on block edges, as the documents there (a chunk straddling a start is another grid)
    cfg = preset("tiny", n_layers=1, n_code=6, block_len=L, flash_chunk_len=L, **overrides)
    # the fused kernels compute in float32 at most; everything else is checked in float64
    dtype = torch.float32 if overrides["attn_backend"] == "triton" else torch.float64
    model = TransformerVQ(cfg).to(dtype).eval()
    with torch.no_grad():
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
        if model.abs_pos_scale is not None:  # (a document packed at column c once got the positions from c on)
            model.abs_pos_scale.fill_(1.0)
    # float32: a parameter gradient sums ~50 tokens' products in another order than the documents alone do
    return model, (1e-4 if dtype == torch.float32 else 1e-10)


def parameter_grads(model, logits, cotangent):
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    return dict(zip(names, torch.autograd.grad((logits * cotangent).sum(), params, allow_unused=True)))


def documented(message: str) -> bool:
    return any(message in path.read_text() for path in (DOCS / "operator.md", DOCS / "training.md"))


@pytest.mark.parametrize("form", ["position_ids", "cu_seqlens"])
@pytest.mark.parametrize("overrides", list(every_kind()))
def test_every_kind_packs_exactly_or_refuses_in_documented_words(overrides, form):
    if overrides["attn_backend"] == "triton" and not torch.cuda.is_available() and \
            os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused kernels need CUDA or TRITON_INTERPRET=1")
    model, tol = kind_model(overrides)
    lengths = [[8, 4, 11, 1], [12, 4, 8]]  # every document but a row's last whole blocks
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    ids = torch.randint(0, 256, position_ids.shape, generator=torch.Generator().manual_seed(1))
    try:
        lengths_flat = torch.tensor([n for row in lengths for n in row])
        documents = {"position_ids": position_ids} if form == "position_ids" else \
            {"cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.long), lengths_flat.cumsum(0)])}
        packed = model(ids, **documents).logits
    except ValueError as refusal:
        assert documented(str(refusal)), f"undocumented refusal: {refusal}"
        return
    cotangent = torch.randn(packed.shape, dtype=packed.dtype, generator=torch.Generator().manual_seed(2))
    alone_grads = {}
    for row, row_lengths in enumerate(lengths):
        for a, b in itertools.pairwise([0, *itertools.accumulate(row_lengths)]):
            alone = model(ids[row:row + 1, a:b]).logits
            torch.testing.assert_close(packed[row:row + 1, a:b], alone, rtol=tol, atol=tol,
                                       msg=lambda m: f"row {row} [{a}, {b}): {m}")
            for name, grad in parameter_grads(model, alone, cotangent[row:row + 1, a:b]).items():
                if grad is not None:
                    alone_grads[name] = alone_grads.get(name, 0) + grad
    for name, grad in parameter_grads(model, packed, cotangent).items():
        if grad is not None:
            torch.testing.assert_close(grad, alone_grads[name], rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
