"""Every operator is called the same way and returns a state of the same protocol (``transformer_vq.ops.protocol``)."""

from __future__ import annotations

import pytest
import torch
from opsutil import make_vq_inputs

from transformer_vq.config import ATTN_TYPES
from transformer_vq.ops import KERNELS, AttentionState

B, H, G, T, L, S = 2, 4, 2, 11, 4, 3
OPTIONS = {"vq": None, "full": {}, "flash_quad": {}, "flash": {"chunk_len": 4}}  # vq: its codes, built per call


def call(attn_type, q, k, v, bias, **kwargs):
    """``KERNELS[attn_type]`` on inputs whose keys equal their codewords, with the operator's own options."""
    options = OPTIONS[attn_type]
    if options is None:
        options = {"z": kwargs.pop("z"), "codebook": kwargs.pop("codebook")}
    kwargs.pop("z", None), kwargs.pop("codebook", None)
    return KERNELS[attn_type](q, k, v, bias, block_len=L, **options, **kwargs)


def test_one_kernel_per_attention_type():
    assert list(KERNELS) == list(ATTN_TYPES)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
def test_shared_signature_and_state_protocol(attn_type):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    v.requires_grad_()
    out, state = call(attn_type, q[:, :, :7], k_hat[:, :, :7], v[:, :, :7], bias[:, :, :7], z=z[:, :, :7],
                      codebook=codebook)
    assert out.shape == (B, H, 7, v.shape[-1])
    assert isinstance(state, AttentionState) and state.offset == 7
    out2, state2 = call(attn_type, q[:, :, 7:], k_hat[:, :, 7:], v[:, :, 7:], bias[:, :, 7:], z=z[:, :, 7:],
                        codebook=codebook, state=state.detach())
    assert out2.shape == (B, H, T - 7, v.shape[-1]) and state2.offset == T
    detached = state2.detach()
    assert type(detached) is type(state2) and detached.offset == T
    assert detached.nbytes() == state2.nbytes() > 0
    whole, _ = call(attn_type, q, k_hat, v, bias, z=z, codebook=codebook)
    torch.testing.assert_close(torch.cat([out, out2], dim=2), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
def test_options_of_another_operator_are_refused(attn_type):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    with pytest.raises(TypeError, match="unexpected keyword argument 'norm'"):
        call(attn_type, q, k_hat, v, bias, z=z, codebook=codebook, norm=1)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
@pytest.mark.parametrize("defect, message", [
    ("heads", "the number of key/value groups G=2 must divide the number of heads H=3"),
    ("bias", r"bias must be \[B, H, T, 2L\] = \[2, 4, 11, 8\], got \[2, 4, 11, 6\]"),
    ("keys", r"must be \[B, G, T, Dk\] = \[2, G, 11, 6\], got \[2, 2, 10, 6\]"),
    ("values", r"v must be \[B, G, T, Dv\] with B, G, T of k(_hat)? \[2, 2, 11\], got \[2, 1, 11, 7\]"),
    ("block_len", "block_len must be a positive integer, got 0"),
    ("block_len_bool", "block_len must be a positive integer, got True"),
    ("no_bias", r"bias must be a \[B, H, T, 2L\] tensor \(zeros for none\), got NoneType"),
    ("empty", r"q must hold at least one position \(T >= 1\)"),
])
def test_bad_shapes_are_named(attn_type, defect, message):
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    block_len = L
    if defect == "heads":
        q = q[:, :3]
    elif defect == "bias":
        bias = bias[..., :6]
    elif defect == "keys":
        k_hat = k_hat[:, :, :10]
    elif defect == "values":
        v = v[:, :1]
    elif defect == "block_len":
        block_len = 0
    elif defect == "block_len_bool":
        block_len = True
    elif defect == "no_bias":
        bias = None
    elif defect == "empty":
        q, k_hat, z, v, bias = (x[:, :, :0] for x in (q, k_hat, z, v, bias))
    options = OPTIONS[attn_type] if OPTIONS[attn_type] is not None else {"z": z, "codebook": codebook}
    with pytest.raises(ValueError, match=message):
        KERNELS[attn_type](q, k_hat, v, bias, block_len=block_len, **options)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
def test_a_state_of_another_operator_or_other_sizes_is_refused(attn_type):
    """Continuing a call means the same operator, sequences and sizes: anything else is named, not a torch error
    from deep inside (or, for a state of another block layout, numbers of neither)."""
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, T, L, S)
    other = next(t for t in ATTN_TYPES if type(call(t, q, k_hat, v, bias, z=z, codebook=codebook)[1]) is not type(
        call(attn_type, q, k_hat, v, bias, z=z, codebook=codebook)[1]))
    _, foreign = call(other, q[:, :, :7], k_hat[:, :, :7], v[:, :, :7], bias[:, :, :7], z=z[:, :, :7],
                      codebook=codebook)
    rest = [x[:, :, 7:] for x in (q, k_hat, v, bias, z)]
    with pytest.raises(ValueError, match="state must be the .* a previous call of this operator returned, got"):
        call(attn_type, *rest[:4], z=rest[4], codebook=codebook, state=foreign)
    _, own = call(attn_type, q[:, :, :7], k_hat[:, :, :7], v[:, :, :7], bias[:, :, :7], z=z[:, :, :7],
                  codebook=codebook)
    with pytest.raises(ValueError, match=r"state\.\w+ is \[2, .*\], this call needs \[1, "):
        call(attn_type, *(x[:1] for x in rest[:4]), z=rest[4][:1], codebook=codebook, state=own)
