"""Turning flat 12,288-token image sequences into PNG files (single images and grids).

Tokens are in the ImageNet64 raster order of :mod:`transformer_vq.data.imagenet64`: row, then
column, then channel (R, G, B), one byte each. Sampling code calls :func:`save_png` and
:func:`save_grid`; any array-like of ints works (lists, numpy arrays, CPU torch tensors).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from transformer_vq.data.errors import DataError
from transformer_vq.data.imagenet64 import CHANNELS, IMAGE_TOKENS, SIDE


def tokens_to_array(tokens) -> np.ndarray:
    """A ``[64, 64, 3]`` ``uint8`` image from 12,288 raster-order tokens (each in 0..255)."""
    values = np.asarray(tokens)
    if values.ndim != 1 and values.size == IMAGE_TOKENS:
        values = values.reshape(-1)
    if values.shape != (IMAGE_TOKENS,):
        raise DataError(f"an image is {IMAGE_TOKENS} tokens (64x64x3), got an array of shape {values.shape}; "
                        f"sample exactly {IMAGE_TOKENS} tokens per image")
    if not np.issubdtype(values.dtype, np.integer):
        raise DataError(f"image tokens must be integers 0..255, got dtype {values.dtype}; pass the sampled token ids")
    if values.size and (values.min() < 0 or values.max() > 255):
        raise DataError(f"image tokens must be bytes 0..255, got values in [{values.min()}, {values.max()}]; "
                        f"was the model trained on a byte-level image corpus?")
    return values.astype(np.uint8).reshape(SIDE, SIDE, CHANNELS)


def save_png(tokens, path: str | os.PathLike) -> Path:
    """Write one image of 12,288 raster-order tokens to ``path`` as a 64x64 RGB PNG; returns the path."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(tokens_to_array(tokens)).save(path, format="PNG")
    return path


def save_grid(images: Sequence, path: str | os.PathLike, *, columns: int | None = None, padding: int = 2,
              background: int = 255) -> Path:
    """Write several images as one PNG grid (row-major, ``columns`` per row, near-square by
    default) separated by ``padding`` pixels of gray level ``background``; returns the path."""
    from PIL import Image

    arrays = [tokens_to_array(tokens) for tokens in images]
    if not arrays:
        raise DataError("save_grid needs at least one image")
    columns = columns or math.ceil(math.sqrt(len(arrays)))
    rows = math.ceil(len(arrays) / columns)
    cell = SIDE + padding
    grid = np.full((rows * cell + padding, columns * cell + padding, CHANNELS), background, dtype=np.uint8)
    for i, image in enumerate(arrays):
        top, left = padding + (i // columns) * cell, padding + (i % columns) * cell
        grid[top:top + SIDE, left:left + SIDE] = image
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path, format="PNG")
    return path
