"""What every attention operator shares: one call signature, one state protocol, one check of the common inputs.

Every kernel of :mod:`transformer_vq.ops` is called as

    out, state = kernel(q, k, v, bias, *, block_len=L, state=None, **options)

with ``q [B, H, T, Dk]``, ``k [B, G, T, Dk]``, ``v [B, G, T, Dv]``, ``bias [B, H, T, 2L]`` and ``out [B, H, T, Dv]``;
the options are the operator's own inputs (the VQ operator's shortcodes, codebook and reduction; FLASH's chunk length).
``state`` is what the previous call on the earlier part of the same sequences returned. docs/operator.md holds the
whole contract.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch

from transformer_vq.config.fields import is_integer
from transformer_vq.ops.documents import check_doc_start


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
                 key_name: str = "k", query_name: str = "q") -> None:
    """Raise ``ValueError`` naming the first inconsistency among the inputs every operator takes."""
    check_qkv(q, k, v, block_len, key_name, query_name)
    check_bias(q, bias, block_len)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_len: int | None, key_name: str = "k",
              query_name: str = "q") -> None:
    """The checks of :func:`check_inputs` that do not involve the bias (an operator may take none; ``block_len``
    ``None``: nor a block length): shapes, sizes, one floating dtype (:func:`call_dtypes`) and one device."""
    if block_len is not None:
        check_positive_int(block_len, "block_len")
    for name, tensor in ((query_name, q), (key_name, k), ("v", v)):
        check_is_tensor(tensor, name)
    if q.dim() != 4:
        raise ValueError(f"{query_name} must be [B, H, T, Dk], got shape {list(q.shape)}")
    batch, n_head, length, d_k = q.shape
    # Indexing, not slicing: a slice of a torch.Size is a new Size, and this runs at every decoded token.
    k_shape, v_shape = k.shape, v.shape
    if len(k_shape) != 4 or k_shape[0] != batch or k_shape[2] != length or k_shape[3] != d_k:
        raise ValueError(f"{key_name} must be [B, G, T, Dk] = [{batch}, G, {length}, {d_k}], got {list(k_shape)}")
    if not (batch and n_head and length and k_shape[1]):
        check_sizes(q, k, query_name, key_name)
    if n_head % k_shape[1] != 0:
        raise ValueError(f"the number of key/value groups G={k_shape[1]} must divide the number of heads H={n_head}")
    if len(v_shape) != 4 or v_shape[0] != batch or v_shape[1] != k_shape[1] or v_shape[2] != length:
        raise ValueError(f"v must be [B, G, T, Dv] with B, G, T of {key_name} {list(k_shape[:3])}, got {list(v_shape)}")
    check_floating(q, query_name)
    check_like(q, {key_name: k, "v": v})


def check_sizes(q: torch.Tensor, k: torch.Tensor, query_name: str = "q", key_name: str = "k") -> None:
    """Raise ``ValueError`` unless ``B``, ``H``, ``T`` (of ``q``) and ``G`` (of ``k``) are all at least 1: an empty
    call has nothing to attend, and the operators divide by these sizes."""
    batch, n_head, length, _ = q.shape
    n_group = k.shape[1]
    for size, name, what, letter in ((batch, query_name, "sequence", "B"), (n_head, query_name, "head", "H"),
                                     (length, query_name, "position", "T"),
                                     (n_group, key_name, "key/value group", "G")):
        if size < 1:
            raise ValueError(f"{name} must hold at least one {what} ({letter} >= 1)")


def check_bias(q: torch.Tensor, bias: torch.Tensor, block_len: int, window_blocks: int = 2) -> None:
    """``bias`` must be ``[B, H, T, window_blocks * L]`` (two blocks for the causal window), of ``q``'s device and
    of a dtype of :func:`call_dtypes`."""
    batch, n_head, length, _ = q.shape
    width = window_blocks * block_len
    if not isinstance(bias, torch.Tensor):
        raise ValueError(f"bias must be a [B, H, T, {window_blocks}L] tensor (zeros for none), got "
                         f"{type(bias).__name__}")
    if bias.shape != (batch, n_head, length, width):
        raise ValueError(f"bias must be [B, H, T, {window_blocks}L] = [{batch}, {n_head}, {length}, {width}], "
                         f"got {list(bias.shape)}")
    check_like(q, {"bias": bias})


def check_reference_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                         block_len: int, *, key_name: str = "k", query_name: str = "q", window_blocks: int = 2,
                         mask: torch.Tensor | None = None, doc_start: torch.Tensor | None = None) -> None:
    """The checks of a dense reference (``*_naive``): what its operator checks of the tensors it shares with it
    (a reference is what a user compares against; a wrong shape must not become a broadcast, nor ``block_len=0``
    a division by zero). ``bias`` ``None``: the operator takes none."""
    check_qkv(q, k, v, block_len, key_name, query_name)
    if bias is not None:
        check_bias(q, bias, block_len, window_blocks)
    check_mask(q, mask)
    check_documents(q, doc_start)


def check_bool_mask(mask: torch.Tensor | None, shape: tuple[int, ...], name: str = "mask",
                    of: str = "input_ids", *, kinds: str = "a bool tensor") -> None:
    """Raise ``ValueError`` unless ``mask`` is ``None`` or a bool tensor of ``shape`` (that of ``of``): a float mask
    would be read as weights, a ``[T]`` or ``[1, T]`` one broadcast over rows it was not meant for. The one rule of
    every mask, the models' (:mod:`transformer_vq.nn.inputs`, which takes integer masks too: ``kinds`` names what
    the caller takes) and the operators'."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(shape):
        got = f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be {kinds} of the shape of {of} {list(shape)}, got {got}")


def check_mask(q: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless ``mask`` (non-causal operators: True at real tokens) is ``None`` or a bool
    ``[B, T]`` tensor of the queries' rows, on their device."""
    if mask is None:
        return
    check_bool_mask(mask, (q.shape[0], q.shape[2]), "mask", of="the queries' [B, T]")
    check_devices(q, {"mask": mask})


def check_documents(q: torch.Tensor, doc_start: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless ``doc_start`` is ``None`` or a bool ``[B, T]`` tensor on ``q``'s device."""
    if doc_start is None:  # the common case, at every decoded token
        return
    check_doc_start(doc_start, q.shape[0], q.shape[2])
    check_devices(q, {"doc_start": doc_start})


def check_is_tensor(value, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a tensor."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}")


def check_floating(tensor: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` unless ``tensor`` has a floating dtype."""
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor, got {tensor.dtype}")


def check_devices(q: torch.Tensor, tensors: dict[str, torch.Tensor | None]) -> None:
    """Raise ``ValueError`` unless every tensor of ``tensors`` (``None``: not given) is on ``q``'s device: torch
    would fail deep inside the operator, or not at all where it copies one across on the side."""
    device = q.device
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} and q on {device}: move every tensor argument, the "
                             f"state's too, to q's device")


def call_dtypes(q: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The dtypes the floating inputs of a call on ``q`` may have: ``q``'s, and under autocast on ``q``'s device
    (``q`` float32 or the autocast dtype) both float32 and the autocast dtype, which autocast's products take in any
    mix (a layer passes a float32 ``q + u`` beside bfloat16 keys and values, and a float32 codebook)."""
    # under autocast, decoding comes here for every input of another dtype: the usual devices cost no lookup
    kind = "cpu" if q.is_cpu else "cuda" if q.is_cuda else q.device.type
    # is_autocast_enabled raises for a device without autocast (meta); is_autocast_available would break a compiled
    # graph, and a compiled call runs on a device that has autocast
    available = kind in ("cpu", "cuda") or torch.compiler.is_compiling() or torch.amp.is_autocast_available(kind)
    if available and torch.is_autocast_enabled(kind):
        low = torch.get_autocast_dtype(kind)
        if q.dtype in (torch.float32, low):
            return torch.float32, low
    return (q.dtype,)


def check_dtypes(q: torch.Tensor, tensors: dict[str, torch.Tensor | None]) -> None:
    """Raise ``ValueError`` unless every tensor of ``tensors`` (``None``: not given) has a dtype of
    :func:`call_dtypes`: outside autocast, ``q``'s own. Another one fails inside torch, or is silently cast (a
    float64 key cut to float32) or promoted (a float32 state continued in float64)."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != q.dtype:  # the common case costs one comparison
            allowed = call_dtypes(q)
            if tensor.dtype not in allowed:
                want = " or ".join(str(dtype) for dtype in allowed)
                raise ValueError(f"{name} must be {want} for q of {q.dtype}, got {tensor.dtype}: pass the inputs, "
                                 f"and continue a state, in one dtype (only autocast mixes float32 with its own)")


def check_like(q: torch.Tensor, tensors: dict[str, torch.Tensor | None]) -> None:
    """:func:`check_devices` and :func:`check_dtypes` of floating inputs, in one pass that costs two comparisons per
    tensor when all is well (it runs at every decoded token)."""
    device, dtype = q.device, q.dtype
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if tensor.device != device:
            check_devices(q, {name: tensor})
        if tensor.dtype != dtype:
            check_dtypes(q, {name: tensor})


def check_positive_int(value, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer ``>= 1`` (a lengths' check; ``True`` is not one)."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_bool(value, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is ``True`` or ``False``: a flag read by truthiness would take the
    string ``"False"`` for ``True``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def reads_values(tensor: torch.Tensor) -> bool:
    """Whether a check may read ``tensor``'s values: on a CPU, outside ``torch.compile``. On a GPU the read would
    synchronize the device at every call (every decoded token of every layer); a meta tensor has no values; compiled,
    it would break the graph."""
    return tensor.is_cpu and not torch.compiler.is_compiling()


def check_code_range(codes: torch.Tensor, n_code: int, name: str, size_name: str) -> None:
    """Raise ``ValueError`` unless every one of ``codes`` lies in ``[0, n_code)``, where :func:`reads_values`
    allows (elsewhere an out-of-range code trips the device's own index assertion)."""
    if codes.numel() == 0 or not reads_values(codes):
        return
    low, high = (int(x) for x in torch.aminmax(codes))  # one pass, not two: it runs at every call on a CPU
    if low < 0 or high >= n_code:
        raise ValueError(f"{name} must lie in [0, {size_name}) = [0, {n_code}), got codes from {low} to {high}")


def check_finite(tensor: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` if ``tensor``, 1-D and short, holds an infinity or a NaN, where :func:`reads_values`
    allows. Its values are read as Python numbers: at a few values that costs a microsecond, a torch reduction and
    its read about ten."""
    if not reads_values(tensor):
        return
    values = tensor.tolist()
    if not all(map(math.isfinite, values)):
        raise ValueError(f"{name} must be finite (no inf or NaN), got {values}")


def check_state(state, state_type: type, shapes: dict[str, tuple[int, ...]], q: torch.Tensor,
                dtypes: dict[str, torch.dtype | None]) -> None:
    """Raise ``ValueError`` unless ``state`` is a ``state_type`` (what this operator returns) whose tensors named in
    ``shapes`` (``None`` where the state has none) have those shapes (``-1``: any size), and those named in
    ``dtypes`` pass :func:`check_state_tensors` for queries ``q``: a state continues the same sequences with the same
    sizes, dtypes and device. Metadata only: nothing is read from the device."""
    if not isinstance(state, state_type):
        raise ValueError(f"state must be the {state_type.__name__} a previous call of this operator returned, got "
                         f"{type(state).__name__}")
    for name, shape in shapes.items():
        tensor = getattr(state, name)
        if tensor is None:
            continue
        got = tensor.shape
        if got == shape:  # every call of a decoding loop comes here: the common case costs one comparison
            continue
        if len(got) != len(shape) or any(want not in (-1, size) for want, size in zip(shape, got)):
            needed = ", ".join("*" if want == -1 else str(want) for want in shape)
            raise ValueError(f"state.{name} is {list(got)}, this call needs [{needed}]: a state continues the same "
                             f"sequences with the same batch, heads and widths")
    check_state_tensors(state, dtypes, q)


def check_state_tensors(state, dtypes: dict[str, torch.dtype | None], q: torch.Tensor) -> None:
    """Raise ``ValueError`` unless each tensor of the state named in ``dtypes`` (``None`` where the state has none) is
    on ``q``'s device and of the dtype named there, or for ``None`` one of :func:`call_dtypes`: a state continues in
    the dtype it was made in (a float32 cache continued in float64 would be promoted, a float64 one fail in torch)."""
    device, dtype = q.device, q.dtype
    for name, want in dtypes.items():
        tensor = getattr(state, name)
        if tensor is None:
            continue
        # every call of a decoding loop comes here: the common case costs a comparison per rule
        if tensor.device != device:
            check_devices(q, {f"state.{name}": tensor})
        if want is None:
            if tensor.dtype != dtype:
                check_dtypes(q, {f"state.{name}": tensor})
        elif tensor.dtype != want:
            raise ValueError(f"state.{name} is {tensor.dtype}, this operator keeps it in {want}: pass the state a "
                             f"previous call returned, unconverted")
