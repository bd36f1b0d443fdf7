"""What every attention operator shares: one call signature, one state protocol, one check of the common inputs.

Every kernel of :mod:`transformer_vq.ops` is called as

    out, state = kernel(q, k, v, bias, *, block_len=L, state=None, **options)

with ``q [B, H, T, Dk]``, ``k [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias [B, H, T, 2L]`` and ``out [B, H, T, Dv]``;
the options are the operator's own inputs (the VQ operator's shortcodes, codebook and reduction; FLASH's chunk length).
``state`` is what the previous call on the earlier part of the same sequences returned. docs/operator.md holds the
whole contract.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class AttentionState(Protocol):
    """What an operator carries between calls on consecutive pieces of the same sequences."""

    @property
    def offset(self) -> int:
        """Number of positions consumed so far (the absolute position of the next query)."""

    def detach(self) -> "AttentionState":
        """The same state cut from the autograd graph (truncated backprop between training windows)."""

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""


class AttentionKernel(Protocol):
    """The call signature shared by every operator."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, /, *, block_len: int,
                 state: AttentionState | None = None, **options) -> tuple[torch.Tensor, AttentionState]: ...


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, block_len: int,
                 key_name: str = "k") -> None:
    """Raise ``ValueError`` naming the first inconsistency among the inputs every operator takes."""
    check_qkv(q, k, v, block_len, key_name)
    check_bias(q, bias, block_len)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_len: int, key_name: str = "k") -> None:
    """The checks of :func:`check_inputs` that do not involve the bias (an operator may take none)."""
    check_positive_int(block_len, "block_len")
    for name, tensor in (("q", q), (key_name, k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, T, Dk], got shape {list(q.shape)}")
    batch, n_head, length, d_k = q.shape
    if length < 1:
        raise ValueError("q must hold at least one position (T >= 1)")
    if k.dim() != 4 or k.shape[:1] + k.shape[2:] != (batch, length, d_k):
        raise ValueError(f"{key_name} must be [B, G, T, Dk] = [{batch}, G, {length}, {d_k}], got {list(k.shape)}")
    if n_head % k.shape[1] != 0:
        raise ValueError(f"the number of key/value groups G={k.shape[1]} must divide the number of heads H={n_head}")
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be [B, G, T, Dv] with B, G, T of {key_name} {list(k.shape[:3])}, got {list(v.shape)}")


def check_bias(q: torch.Tensor, bias: torch.Tensor, block_len: int, window_blocks: int = 2) -> None:
    """``bias`` must be ``[B, H, T, window_blocks * L]`` (two blocks for the causal window)."""
    batch, n_head, length, _ = q.shape
    width = window_blocks * block_len
    if not isinstance(bias, torch.Tensor):
        raise ValueError(f"bias must be a [B, H, T, {window_blocks}L] tensor (zeros for none), got "
                         f"{type(bias).__name__}")
    if bias.shape != (batch, n_head, length, width):
        raise ValueError(f"bias must be [B, H, T, {window_blocks}L] = [{batch}, {n_head}, {length}, {width}], "
                         f"got {list(bias.shape)}")


def check_positive_int(value, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer ``>= 1`` (a lengths' check; ``True`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_state(state, state_type: type, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` unless ``state`` is a ``state_type`` (what this operator returns) whose tensors named in
    ``shapes`` have those shapes (``-1``: any size): a state continues the same sequences with the same sizes.
    Shapes only: nothing is read from the device."""
    if not isinstance(state, state_type):
        raise ValueError(f"state must be the {state_type.__name__} a previous call of this operator returned, got "
                         f"{type(state).__name__}")
    for name, shape in shapes.items():
        got = getattr(state, name).shape
        if got == shape:  # every call of a decoding loop comes here: the common case costs one comparison
            continue
        if len(got) != len(shape) or any(want not in (-1, size) for want, size in zip(shape, got)):
            needed = ", ".join("*" if want == -1 else str(want) for want in shape)
            raise ValueError(f"state.{name} is {list(got)}, this call needs [{needed}]: a state continues the same "
                             f"sequences with the same batch, heads and widths")
