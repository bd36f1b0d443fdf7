"""PNG output of sampled images (single and grid)."""

import numpy as np
import pytest
import torch
from PIL import Image

from transformer_vq.data import DataError
from transformer_vq.data.images import save_grid, save_png, tokens_to_array


def gradient(shift=0):
    rows, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    return np.stack([rows * 4, cols * 4, np.full_like(rows, shift)], axis=-1).astype(np.uint8).reshape(-1)


def test_png_round_trip(tmp_path):
    tokens = gradient(7)
    path = save_png(tokens.tolist(), tmp_path / "out" / "a.png")
    with Image.open(path) as image:
        assert image.mode == "RGB" and image.size == (64, 64)
        pixels = np.asarray(image)
    assert np.array_equal(pixels.reshape(-1), tokens)
    assert pixels[10, 20].tolist() == [40, 80, 7]  # row 10, column 20


def test_torch_tensor_input(tmp_path):
    path = save_png(torch.from_numpy(gradient().astype(np.int64)), tmp_path / "t.png")
    with Image.open(path) as image:
        assert np.array_equal(np.asarray(image).reshape(-1), gradient())


def test_grid_layout(tmp_path):
    images = [gradient(shift) for shift in (1, 2, 3, 4, 5)]
    path = save_grid(images, tmp_path / "grid.png", padding=2)
    with Image.open(path) as grid:
        pixels = np.asarray(grid)
    assert pixels.shape == (2 * 66 + 2, 3 * 66 + 2, 3)  # 5 images -> 3 columns x 2 rows
    assert pixels[0, 0].tolist() == [255, 255, 255]  # padding
    assert np.array_equal(pixels[68:132, 68:132].reshape(-1), images[4])  # 5th image: row 1, column 1
    assert (pixels[68:132, 134:198] == 255).all()  # empty cell


def test_bad_tokens():
    with pytest.raises(DataError, match=r"an image is 12288 tokens \(64x64x3\), got an array of shape \(100,\)"):
        tokens_to_array(np.zeros(100))
    with pytest.raises(DataError, match=r"image tokens must be bytes 0..255, got values in \[0, 256\]"):
        tokens_to_array(np.concatenate([np.zeros(12287, dtype=np.int64), [256]]))
    with pytest.raises(DataError, match="image tokens must be integers 0..255, got dtype float64"):
        tokens_to_array(np.zeros(12288))
    with pytest.raises(DataError, match="at least one image"):
        save_grid([], "unused.png")
