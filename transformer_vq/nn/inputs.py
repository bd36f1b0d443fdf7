"""What a model checks of its call before any work: the token ids and targets and the masks (the state it continues:
:func:`transformer_vq.nn.state.check_continued_state`).

One place for every model (Transformer-VQ, the LongVQ language model and classifier, the baseline classifiers), so
that a bad call is refused alike wherever it comes, by name, before a forward pass is spent on it; the alternative
is a torch error from deep inside (an index out of range in the embedding, a broadcast in the loss) or, worse, an
answer: padding attended as if it were text.
"""

from __future__ import annotations

import torch

from transformer_vq.ops.protocol import check_bool_mask  # the rule of every mask, the operators' too

IGNORE_INDEX = -100
"""The label of a position without a target in Hugging Face's (and PyTorch's cross-entropy's) convention."""

MASK_KINDS = "a bool or integer (0/1) tensor"
"""What a model takes as a mask: bool, or an integer 0/1 mask as tokenizers return one (nonzero: a real token). A
floating mask is refused: it could be weights, or an additive mask (0 at real tokens), which would read inverted."""

__all__ = ["IGNORE_INDEX", "as_mask", "causal_padding", "check_features", "check_token_ids"]


def check_token_ids(ids: torch.Tensor, n_ids: int, name: str = "input_ids", *, shape: torch.Size | None = None,
                    shape_name: str = "input_ids", ignore: int | None = None) -> None:
    """Raise ``ValueError`` unless ``ids`` is an int64 ``[B, T]`` tensor, ``B, T >= 1``, of ids in ``[0, n_ids)``
    (of ``shape`` when given: targets, one per position of ``shape_name``; ``ignore``: a value allowed besides, the
    label of a position without a target). The range is read in one pass (on a GPU, one device sync per call: the
    price of naming the bad id instead of the device's own index assertion)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long or 0 in ids.shape:
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a [batch, length] int64 tensor with batch >= 1 and length >= 1, got {got}")
    if shape is not None and ids.shape != shape:
        raise ValueError(f"{name} must have the shape of {shape_name} {tuple(shape)} (one target per input "
                         f"position), got {tuple(ids.shape)}")
    read = ids if ignore is None else ids.masked_fill(ids == ignore, 0)
    low, high = (int(x) for x in torch.aminmax(read))
    if low < 0 or high >= n_ids:
        besides = "" if ignore is None else f" (and not {ignore}, the label of a position without a target)"
        advice = "check the tokenizer or set vocab_size to cover it"
        if ignore is None and shape is not None and low == IGNORE_INDEX:  # Hugging Face's way, given to a native model
            advice = (f"{IGNORE_INDEX} marks a position without a target in Hugging Face's labels; here give any id "
                      f"there and loss_mask False")
        raise ValueError(f"{name} holds token id {low if low < 0 else high}, outside the vocabulary [0, {n_ids})"
                         f"{besides}; {advice}")


def check_features(x: torch.Tensor, width: int, name: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is a floating ``[B, T, width]`` tensor with ``B, T >= 1`` (a layer's
    input: a wrong width would surface as a matmul's shape error inside it)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != width or not x.dtype.is_floating_point \
            or 0 in x.shape:
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating [batch, length, {width}] tensor with batch, length >= 1, "
                         f"got {got}")


def as_mask(mask: torch.Tensor | None, shape: tuple[int, ...], name: str = "mask",
            of: str = "input_ids") -> torch.Tensor | None:
    """``mask`` as the bool ``[B, T]`` tensor the layers take (``None`` stays ``None``); raises ``ValueError`` unless
    it is :data:`MASK_KINDS` of ``shape`` (that of ``of``). An integer mask is compared with 0 once, on its device:
    no host read."""
    if isinstance(mask, torch.Tensor) and not (mask.dtype == torch.bool or mask.dtype.is_floating_point
                                               or mask.dtype.is_complex):
        mask = mask != 0
    check_bool_mask(mask, shape, name, of, kinds=MASK_KINDS)
    return mask


LEFT_PADDING_HF = ("or, to generate from left-padded prompts, use the Hugging Face model (docs/huggingface.md), "
                   "which runs each row from its own first token")
"""Where a Transformer-VQ user with left-padded prompts goes (the other families have no Hugging Face model)."""


def causal_padding(mask: torch.Tensor | None, left_padding: str = "or run each prompt alone") -> bool:
    """Whether a causal model's ``mask`` (bool ``[B, T]``, True for real tokens) holds padding; raises
    ``ValueError`` where a real token follows padding. A causal model attends every earlier key of its row, and its
    operators carry one position for the whole batch, so padding before a real token would be attended (and shift
    the row's blocks). Trailing padding is attended by no real token. ``left_padding``: the model's own way to run
    left-padded rows, said in the refusal (Transformer-VQ's: :data:`LEFT_PADDING_HF`). One read of two flags."""
    if mask is None:
        return False
    before_real, padded = torch.stack([(mask[:, 1:] & ~mask[:, :-1]).any(), ~mask.all()]).tolist()
    if before_real:
        raise ValueError(f"a causal model takes trailing padding only, and mask has a real token after a padding "
                         f"token: a real token would attend the padding; pad rows of different lengths on the right, "
                         f"{left_padding}")
    return padded
