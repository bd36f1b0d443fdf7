"""The input checks every operator shares (``transformer_vq.ops.protocol``): a state owns its tensors, empty sizes,
the dtype and device rule, option values and masks, and checks that read no values off a CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from opsutil import assert_holds_only_what_it_reports, make_vq_inputs

from transformer_vq.ops import (flash_attention, flash_quad_attention, full_attention, vq_attention,
                                vq_bidir_attention, vq_qk_attention, vq_qk_attention_noncausal)
from transformer_vq.ops.full.bidir import full_bidir_attention
from transformer_vq.ops.vq_qk import code_pair_table

L, S_Q, S_K = 4, 3, 5


def make(B=2, H=2, G=1, T=9, dtype=torch.float64, seed=0):
    """The inputs of every operator: queries and keys equal to their codewords, a mask and packed documents."""
    _, k, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S_K, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    codebook_q = torch.randn(H, S_Q, k.shape[-1], generator=gen, dtype=dtype)
    z_q = torch.randint(0, S_Q, (B, H, T), generator=gen)
    q = codebook_q[torch.arange(H)[:, None], z_q]  # (B, H, T, Dk): the quantized queries serve every operator
    bias3 = torch.randn(B, H, T, 3 * L, generator=gen, dtype=dtype)
    doc_start = torch.arange(T).expand(B, T) == T // 2
    return dict(q=q, k=k, v=v, bias=bias, bias3=bias3, z=z, codebook=codebook, z_q=z_q, codebook_q=codebook_q,
                mask=torch.ones(B, T, dtype=torch.bool), doc_start=doc_start)


OPERATORS = {
    "vq": lambda x, **o: vq_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, z=x["z"],
                                      codebook=x["codebook"], doc_start=x["doc_start"], **o),
    "full": lambda x, **o: full_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, doc_start=x["doc_start"],
                                          **o),
    "flash_quad": lambda x, **o: flash_quad_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L,
                                                      doc_start=x["doc_start"], **o),
    "flash": lambda x, **o: flash_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, chunk_len=4,
                                            doc_start=x["doc_start"], **o),
    "vq_qk": lambda x, **o: vq_qk_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, z_q=x["z_q"],
                                            codebook_q=x["codebook_q"], z=x["z"], codebook=x["codebook"],
                                            doc_start=x["doc_start"], **o),
    "vq_bidir": lambda x, **o: vq_bidir_attention(x["q"], x["k"], x["v"], x["bias3"], block_len=L, z=x["z"],
                                                  codebook=x["codebook"], mask=x["mask"], doc_start=x["doc_start"],
                                                  **o),
    "full_bidir": lambda x, **o: full_bidir_attention(x["q"], x["k"], x["v"], x["bias3"], block_len=L,
                                                      mask=x["mask"], doc_start=x["doc_start"], **o),
    "vq_qk_noncausal": lambda x, **o: (vq_qk_attention_noncausal(
        x["q"], x["k"], x["v"], z_q=x["z_q"], codebook_q=x["codebook_q"], z=x["z"], codebook=x["codebook"],
        mask=x["mask"], **o), None),
}
CAUSAL = ["vq", "full", "flash_quad", "flash", "vq_qk"]
QUANTIZED = {"vq", "vq_qk", "vq_bidir", "vq_qk_noncausal"}  # name their keys k_hat
QUERY_CODES = {"vq_qk", "vq_qk_noncausal"}  # name their queries q_hat
READS = {  # the inputs each operator takes besides q
    "vq": ("k", "v", "bias", "z", "codebook", "doc_start"),
    "full": ("k", "v", "bias", "doc_start"),
    "flash_quad": ("k", "v", "bias", "doc_start"),
    "flash": ("k", "v", "bias", "doc_start"),
    "vq_qk": ("k", "v", "bias", "z", "codebook", "z_q", "codebook_q", "doc_start"),
    "vq_bidir": ("k", "v", "bias3", "z", "codebook", "mask", "doc_start"),
    "full_bidir": ("k", "v", "bias3", "mask", "doc_start"),
    "vq_qk_noncausal": ("k", "v", "z", "codebook", "z_q", "codebook_q", "mask"),
}
FLOATING = ("k", "v", "bias", "bias3", "codebook", "codebook_q")


def shown(op: str, name: str) -> str:
    """How the operator names input ``name`` in its messages."""
    if name == "k" and op in QUANTIZED:
        return "k_hat"
    if name == "q" and op in QUERY_CODES:
        return "q_hat"
    return {"bias3": "bias"}.get(name, name)


def cases(names):
    return [(op, name) for op in OPERATORS for name in READS[op] if name in names]


def moved(state, device):
    """``state`` with every tensor on ``device``."""
    return dataclasses.replace(state, **{f.name: getattr(state, f.name).to(device) for f in dataclasses.fields(state)
                                         if isinstance(getattr(state, f.name), torch.Tensor)})


@pytest.mark.parametrize("attn_type", CAUSAL)
@pytest.mark.parametrize("piece", [L, 1])
def test_a_state_owns_its_tensors(attn_type, piece):
    """A decoding loop that refills one key, value and code buffer per call gets the outputs of one call: a state
    keeps copies, never the caller's tensors (whole blocks and single tokens)."""
    x = make(T=3 * L)
    x["doc_start"] = torch.zeros_like(x["doc_start"])  # one document: every query reads the cache of older keys
    whole, _ = OPERATORS[attn_type](x)
    buffers = {name: torch.empty_like(x[name][:, :, :piece]) for name in ("k", "v", "z")}
    state, outs = None, []
    for a in range(0, 3 * L, piece):
        for name, buffer in buffers.items():
            buffer.copy_(x[name][:, :, a:a + piece])
        part = {name: tensor[..., a:a + piece, :] if tensor.dim() == 4 else tensor for name, tensor in x.items()}
        part.update(buffers, z_q=x["z_q"][:, :, a:a + piece], doc_start=x["doc_start"][:, a:a + piece])
        out, state = OPERATORS[attn_type](part, state=state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attn_type", CAUSAL)
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("documents", [False, True])
def test_a_state_keeps_only_what_it_reports(attn_type, grad, documents):
    """After a long prefill a state holds its own tensors, not views of the call's whole keys and values or of its
    running sums: decoding after 64k tokens kept every layer's 64k keys alive while ``nbytes()`` reported a window."""
    x = make(T=16 * L + 2)
    x["doc_start"] = torch.zeros_like(x["doc_start"]) if documents else None
    if grad:
        x["q"].requires_grad_()
    _, state = OPERATORS[attn_type](x)
    assert_holds_only_what_it_reports(state)

@pytest.mark.parametrize("attn_type", ["full", "flash_quad"])
def test_gradients_still_reach_the_keys_through_a_carried_cache(attn_type):
    """The cache's copy is differentiable: a state carried without ``detach`` passes the gradient back to the keys
    and values of the earlier call, as one call does."""
    x = make(T=2 * L + 1)
    leaves = [x[name].requires_grad_() for name in ("q", "k", "v", "bias")]
    whole, _ = OPERATORS[attn_type](x)
    first, state = OPERATORS[attn_type]({**x, **{n: x[n][:, :, :L] for n in ("q", "k", "v", "bias")},
                                         "doc_start": x["doc_start"][:, :L]})
    second, _ = OPERATORS[attn_type]({**x, **{n: x[n][:, :, L:] for n in ("q", "k", "v", "bias")},
                                      "doc_start": x["doc_start"][:, L:]}, state=state)
    cotangent = torch.randn_like(whole)
    for got, want in zip(torch.autograd.grad(torch.cat([first, second], dim=2), leaves, cotangent),
                         torch.autograd.grad(whole, leaves, cotangent)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attn_type", OPERATORS)
@pytest.mark.parametrize("size, message", [
    (dict(B=0), "{q} must hold at least one sequence (B >= 1)"),
    (dict(H=0), "{q} must hold at least one head (H >= 1)"),
    (dict(G=0), "{k} must hold at least one key/value group (G >= 1)"),
    (dict(T=0), "{q} must hold at least one position (T >= 1)"),
], ids=["B", "H", "G", "T"])
def test_empty_sizes_are_refused(attn_type, size, message):
    """One rule for every operator: an empty batch, head set, group set or sequence is a ``ValueError``."""
    x = make(**size)
    with pytest.raises(ValueError) as caught:
        OPERATORS[attn_type](x)
    assert str(caught.value) == message.format(q=shown(attn_type, "q"), k=shown(attn_type, "k"))


@pytest.mark.parametrize("attn_type, name", cases(FLOATING))
def test_a_floating_input_of_another_dtype_is_refused(attn_type, name):
    x = make()
    x[name] = x[name].float()
    with pytest.raises(ValueError, match=f"^{shown(attn_type, name)} must be torch.float64 for q of torch.float64, "
                                         f"got torch.float32: "):
        OPERATORS[attn_type](x)


@pytest.mark.parametrize("attn_type", OPERATORS)
def test_queries_must_be_floating_and_set_the_dtype(attn_type):
    x = make()
    with pytest.raises(ValueError, match=f"^{shown(attn_type, 'k')} must be torch.float32 for q of torch.float32"):
        OPERATORS[attn_type]({**x, "q": x["q"].float()})
    with pytest.raises(ValueError, match=f"^{shown(attn_type, 'q')} must be a floating tensor, got torch.int64$"):
        OPERATORS[attn_type]({**x, "q": x["q"].long()})


@pytest.mark.parametrize("attn_type, name", cases(READS["vq_qk"] + READS["vq_bidir"]))
def test_an_input_on_another_device_is_refused(attn_type, name):
    x = make()
    x[name] = x[name].to("meta")
    with pytest.raises(ValueError, match=f"^{shown(attn_type, name)} is on meta and q on cpu: "):
        OPERATORS[attn_type](x)


@pytest.mark.parametrize("attn_type", CAUSAL)
def test_a_state_of_another_dtype_or_device_is_refused(attn_type):
    """A state continues in the dtype and on the device it was made on: a float64 state would be promoted into a
    float32 call (or fail deep in torch), one on another device would fail in torch."""
    x = make()
    head = {name: tensor[..., :5, :] if tensor.dim() == 4 else tensor for name, tensor in x.items()}
    head.update(z=x["z"][:, :, :5], z_q=x["z_q"][:, :, :5], doc_start=x["doc_start"][:, :5])
    tail = {name: tensor[..., 5:, :] if tensor.dim() == 4 else tensor for name, tensor in x.items()}
    tail.update(z=x["z"][:, :, 5:], z_q=x["z_q"][:, :, 5:], doc_start=x["doc_start"][:, 5:])
    _, state = OPERATORS[attn_type](head)
    as_float32 = {name: t.float() if t.is_floating_point() else t for name, t in tail.items()}
    with pytest.raises(ValueError, match=r"^state\.\w+ (must be|is) "):
        OPERATORS[attn_type](as_float32, state=state)
    with pytest.raises(ValueError, match=r"^state\.\w+ is on meta and q on cpu: "):
        OPERATORS[attn_type](tail, state=moved(state, "meta"))


@pytest.mark.parametrize("attn_type", OPERATORS)
def test_the_mixes_of_the_layers_under_autocast_run(attn_type):
    """Under bfloat16 autocast a layer passes a float32 ``q + u`` beside bfloat16 keys, values and bias, float32
    codebooks, and a state made before autocast: all accepted, and near the float32 result. Without autocast the
    same mix is refused (``test_a_floating_input_of_another_dtype_is_refused``)."""
    x = make(dtype=torch.float32)
    mixed = {name: x[name].bfloat16() if name in ("k", "v", "bias", "bias3") else x[name] for name in x}
    state = None
    if attn_type in CAUSAL:
        _, state = OPERATORS[attn_type]({**x, "doc_start": torch.zeros_like(x["doc_start"])})
        x = {**x, "doc_start": torch.zeros_like(x["doc_start"])}
        mixed["doc_start"] = x["doc_start"]
    want, _ = OPERATORS[attn_type](x, **({} if state is None else {"state": state}))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = OPERATORS[attn_type](mixed, **({} if state is None else {"state": state}))
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("attn_type", ["vq_qk", "vq_qk_noncausal"])
def test_a_table_held_from_autocast_serves_a_float32_call(attn_type):
    """Precomputed scores (``table``, ``code_scores``) may be of any floating dtype: they are added in float32 at
    least, and a table held from an autocast call is bfloat16."""
    x = make(dtype=torch.float32)
    table = code_pair_table(x["codebook_q"], x["codebook"])
    want, _ = OPERATORS[attn_type](x, table=table)
    got, _ = OPERATORS[attn_type](x, table=table.bfloat16())
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("attn_type", ["vq", "vq_qk"])
@pytest.mark.parametrize("value", ["False", None, 0, 1])
def test_compressive_cache_must_be_a_bool(attn_type, value):
    """Read by truthiness, the string "False" was True and 0 was False, silently."""
    with pytest.raises(ValueError, match=f"^compressive_cache must be True or False, got {value!r}$"):
        OPERATORS[attn_type](make(), compressive_cache=value)


@pytest.mark.parametrize("attn_type", ["vq_bidir", "full_bidir", "vq_qk_noncausal"])
@pytest.mark.parametrize("mask, got", [
    (torch.ones(1, 9, dtype=torch.bool), r"torch.bool \[1, 9\]"),  # would broadcast row 0's mask to row 1
    (torch.ones(2, 9, dtype=torch.long), r"torch.int64 \[2, 9\]"),
    ([[True] * 9] * 2, "list"),
], ids=["one-row", "int64", "list"])
def test_a_mask_is_checked_alike_by_every_noncausal_operator(attn_type, mask, got):
    with pytest.raises(ValueError, match=rf"^mask must be a bool tensor of the shape of the queries' \[B, T\] "
                                         rf"\[2, 9\], got {got}$"):
        OPERATORS[attn_type]({**make(), "mask": mask})


@pytest.mark.parametrize("attn_type", ["vq", "vq_qk", "vq_qk_noncausal"])
def test_codes_are_not_read_off_a_cpu(attn_type):
    """The code-range checks read values on a CPU only: on a GPU that would synchronize the device at every call,
    and meta tensors have no values (the operator runs there, shapes only)."""
    x = {name: tensor.to("meta") for name, tensor in make().items()}
    out, _ = OPERATORS[attn_type](x)
    assert out.device.type == "meta" and out.shape == (2, 2, 9, x["v"].shape[-1])
    x = make()
    x["z_q" if attn_type != "vq" else "z"][0, 0, 0] = 7
    with pytest.raises(ValueError, match=r"must lie in \[0, S(_q)?\) = \[0, [35]\), got codes from \d to 7"):
        OPERATORS[attn_type](x)
