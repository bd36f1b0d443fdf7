"""Packed documents through the whole model (position_ids or cu_seqlens): no token sees another document.

In float64: documents starting on a block edge get exactly what they get alone from position 0, logits and every
parameter gradient; documents starting anywhere are held to the dense formula (``attention="quadratic"``) and to
their independence (changing an earlier document changes nothing after it); a document crossing a training window
with the state carried equals one call.
"""

from __future__ import annotations

import pytest
import torch

from transformer_vq import TransformerVQ, preset

L = 4
KINDS = {
    "vq-shga": dict(),
    "vq-mha": dict(head_type="mha", n_head=2, d_v=64),
    "vq-mqa": dict(head_type="mqa", n_head=2, d_v=64),
    "vq_qk": dict(quantize_queries=True),
    "full": dict(attn_type="full"),
    "flash_quad": dict(attn_type="flash_quad"),
    "flash": dict(attn_type="flash", flash_chunk_len=L),  # chunks on block edges, as the documents there
}
TOL = 1e-12  # float64: only the summation order differs


def tiny_model(**overrides):
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=L, **overrides)).to(torch.float64).eval()
    with torch.no_grad():
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
    return model


def positions(lengths_per_row):
    """``position_ids [B, T]`` of rows packed with documents of these lengths."""
    return torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in lengths_per_row])


def ids_for(position_ids, seed=1):
    return torch.randint(0, 256, position_ids.shape, generator=torch.Generator().manual_seed(seed))


def parameter_grads(model, logits, cotangent):
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(zip([n for n, p in model.named_parameters() if p.requires_grad],
                    torch.autograd.grad((logits * cotangent).sum(), params, allow_unused=True)))


@pytest.mark.parametrize("kind", KINDS)
def test_documents_on_block_edges_equal_each_alone(kind):
    model = tiny_model(**KINDS[kind])
    position_ids = positions([[4, 8, 4, 7], [12, 1 * 4, 7]])  # every document but a row's last is whole blocks
    ids = ids_for(position_ids)
    packed = model(ids, position_ids=position_ids).logits
    cotangent = torch.randn(packed.shape, dtype=packed.dtype, generator=torch.Generator().manual_seed(2))
    want_grads = parameter_grads(model, packed, cotangent)
    alone_grads = {}
    for row in range(ids.shape[0]):
        starts = (position_ids[row] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
        for a, b in zip(starts[:-1], starts[1:]):
            alone = model(ids[row:row + 1, a:b]).logits
            torch.testing.assert_close(packed[row:row + 1, a:b], alone, rtol=TOL, atol=TOL)
            for name, grad in parameter_grads(model, alone, cotangent[row:row + 1, a:b]).items():
                if grad is not None:
                    alone_grads[name] = alone_grads.get(name, 0) + grad
    for name, grad in want_grads.items():
        if grad is not None:
            torch.testing.assert_close(grad, alone_grads[name], rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_no_document_sees_another(kind):
    """Documents of 1 token, inside a block, several in a block: changing the tokens of one document changes no
    logit outside it."""
    model = tiny_model(**KINDS[kind])
    position_ids = positions([[3, 1, 1, 1, 7, 11, 1, 12], [16, 14, 7]])
    ids = ids_for(position_ids)
    logits = model(ids, position_ids=position_ids).logits
    changed = ids.clone()
    changed[0, 6:13] = (changed[0, 6:13] + 1) % 256  # the document [6, 13) of row 0
    other = model(changed, position_ids=position_ids).logits
    torch.testing.assert_close(other[0, :6], logits[0, :6], rtol=0, atol=0)
    torch.testing.assert_close(other[0, 13:], logits[0, 13:], rtol=TOL, atol=TOL)
    assert not torch.allclose(other[0, 6:13], logits[0, 6:13])
    if not kind.startswith("vq"):
        return
    quadratic = model(ids, position_ids=position_ids, attention="quadratic").logits
    torch.testing.assert_close(logits, quadratic, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["vq-shga", "vq-mqa", "full", "flash"])
def test_state_carried_across_a_boundary_equals_one_call(kind):
    """Truncated backprop through time: a document runs from one window into the next (its positions continue),
    another begins inside the second window."""
    model = tiny_model(**KINDS[kind])
    position_ids = positions([[9, 13, 7], [5, 24]])
    ids = ids_for(position_ids)
    whole = model(ids, position_ids=position_ids).logits
    first = model(ids[:, :14], position_ids=position_ids[:, :14])
    second = model(ids[:, 14:], first.state, position_ids=position_ids[:, 14:])
    pieces = torch.cat([first.logits, second.logits], dim=1)
    torch.testing.assert_close(pieces, whole, rtol=TOL, atol=TOL)
    cotangent = torch.randn(whole.shape, dtype=whole.dtype, generator=torch.Generator().manual_seed(3))
    got, want = parameter_grads(model, pieces, cotangent), parameter_grads(model, whole, cotangent)
    for name in want:
        if want[name] is not None:
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-10, msg=name)


def test_a_packed_state_continued_without_positions_continues_each_row_s_last_document():
    """On an absolute-position model, a call (or ``generate``) that continues a packed call's state with no
    ``position_ids`` places its tokens in each row's last document (positions 12, 13, 14 of row 0's), not at the
    row's own positions (20, 21, 22): as the one call whose positions say so, and whatever the rows' documents."""
    model = tiny_model(abs_pos=True)
    with torch.no_grad():
        model.abs_pos_scale.fill_(0.5)
    position_ids = positions([[8, 15], [4, 19]])
    ids = ids_for(position_ids)
    whole = model(ids, position_ids=position_ids).logits
    first = model(ids[:, :20], position_ids=position_ids[:, :20])
    second = model(ids[:, 20:], first.state.detach())  # the state as training carries it
    torch.testing.assert_close(second.logits, whole[:, 20:], rtol=TOL, atol=TOL)
    assert second.state.positions.tolist() == [15, 19]
    greedy = model.generate(ids[:, 20:21], 2, state=first.state, temperature=0)
    steps = model(torch.cat([ids[:, 20:21], greedy[:, 1:2]], 1), first.state).logits
    torch.testing.assert_close(steps[:, 0], whole[:, 20], rtol=TOL, atol=TOL)
    assert torch.equal(greedy[:, 1:], steps.argmax(-1))


def test_cu_seqlens_equal_position_ids():
    model = tiny_model()
    position_ids = positions([[5, 3, 9], [17]])
    ids = ids_for(position_ids)
    cu_seqlens = torch.tensor([0, 5, 8, 17, 34], dtype=torch.int32)
    torch.testing.assert_close(model(ids, cu_seqlens=cu_seqlens).logits, model(ids, position_ids=position_ids).logits,
                               rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["vq", "vq_qk", "full"])
def test_an_encoder_keeps_documents_apart_on_both_sides(kind):
    """Non-causal: changing one document (starting inside a block) changes no logit outside it, before or after;
    the VQ encoder equals its dense formula with the same documents."""
    overrides = {"vq": {}, "vq_qk": dict(quantize_queries=True), "full": dict(attn_type="full")}[kind]
    model = tiny_model(causal=False, **overrides)
    position_ids = positions([[3, 1, 9, 7, 1, 16], [16, 14, 7]])
    ids = ids_for(position_ids)
    logits = model(ids, position_ids=position_ids).logits
    changed = ids.clone()
    changed[0, 4:13] = (changed[0, 4:13] + 1) % 256  # the document [4, 13) of row 0
    other = model(changed, position_ids=position_ids).logits
    torch.testing.assert_close(other[0, :4], logits[0, :4], rtol=TOL, atol=TOL)
    torch.testing.assert_close(other[0, 13:], logits[0, 13:], rtol=TOL, atol=TOL)
    torch.testing.assert_close(other[1], logits[1], rtol=0, atol=0)
    assert not torch.allclose(other[0, 4:13], logits[0, 4:13])
    if kind.startswith("vq"):
        quadratic = model(ids, position_ids=position_ids, attention="quadratic").logits
        torch.testing.assert_close(logits, quadratic, rtol=1e-10, atol=1e-10)


def test_context_parallelism_says_it_does_not_pack():
    from transformer_vq.nn.attend import check_call

    message = ("context parallelism does not take packed documents yet (position_ids or cu_seqlens): leave "
               "context_parallel at 1 to pack")
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        check_call(tiny_model().cfg, "linear", None, torch.zeros(1, 4, dtype=torch.bool), context_parallel=object())


def test_the_loss_of_a_packed_row_is_the_loss_of_its_documents_alone():
    """``ce_loss`` of a packed row scores no document's last token on the next document's first token: it is the
    token-weighted loss of the documents run alone, each on its own next tokens (it was not: 5.6537 against 5.6551)."""
    model = tiny_model().double()
    lengths = (8, 4, 8)
    P = positions([lengths])
    ids = ids_for(torch.cat([P, P[:, :1]], dim=1))
    x, y = ids[:, :-1], ids[:, 1:]
    packed = model(x, targets=y, position_ids=P).ce_loss
    total, count, start = 0.0, 0, 0
    for n in lengths:
        scored = n if start + n == x.shape[1] else n - 1  # the row's last token keeps its target, the call's
        out = model(x[:, start:start + n], targets=y[:, start:start + n],
                    loss_mask=torch.arange(n)[None] < scored)
        total, count, start = total + out.ce_loss * scored, count + scored, start + n
    torch.testing.assert_close(packed, total / count, rtol=1e-12, atol=1e-12)
    given = torch.ones_like(x, dtype=torch.bool)
    given[:, 2] = False  # a caller's own loss mask is kept beside the boundaries
    assert not torch.allclose(model(x, targets=y, position_ids=P, loss_mask=given).ce_loss, packed)
