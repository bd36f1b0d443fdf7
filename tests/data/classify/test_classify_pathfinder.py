"""Pathfinder: the Pathfinder-style generator (seeded, labels by construction) and the release loader."""

import numpy as np
import pytest
from PIL import Image

from transformer_vq.data import DataError
from transformer_vq.data.classify import load_classification
from transformer_vq.data.classify.pathfinder import layout, render

SMALL = dict(n_train=24, n_validation=6, n_test=6, seed=5)


def component_of(points: np.ndarray, start: np.ndarray, link: float) -> np.ndarray:
    """Which ``points`` are joined to ``start`` by hops shorter than ``link`` (grown breadth first)."""
    near = np.linalg.norm(points[:, None] - points[None], axis=-1) < link
    reached = np.linalg.norm(points - start, axis=-1) < 1e-9
    while True:
        grown = reached | near[reached].any(axis=0)
        if (grown == reached).all():
            return reached
        reached = grown


def test_generated_images_are_seeded_and_split_size_independent(tmp_path):
    data = load_classification("pathfinder", **SMALL)
    assert (data.vocab_size, data.n_classes, data.max_len) == (256, 2, 1024)
    assert data.class_names == ("disconnected", "connected")
    train = np.asarray(data.splits["train"].tokens).reshape(24, 1024)
    assert set(np.unique(train)) == {0, 255}
    assert 0.03 < (train == 255).mean() < 0.4  # strokes on a black canvas, not a blank or filled one
    assert 6 <= data.splits["train"].labels.sum() <= 18
    bigger = load_classification("pathfinder", cache_dir=tmp_path / "c2", **{**SMALL, "n_train": 30})
    assert np.array_equal(np.asarray(bigger.splits["train"].tokens)[:24 * 1024], train.reshape(-1))
    assert np.array_equal(np.asarray(bigger.splits["test"].tokens), np.asarray(data.splits["test"].tokens))
    other = load_classification("pathfinder", **{**SMALL, "seed": 6})
    assert not np.array_equal(np.asarray(other.splits["train"].tokens), train.reshape(-1))


@pytest.mark.parametrize("side", [32, 128])
def test_labels_say_whether_one_dashed_contour_joins_the_dots(side):
    """Hops shorter than 2.3 px (x side / 32) cross a 2 px gap of a dash line but not the 4 px kept
    between separate contours (less rounding to pixels): the dots are joined exactly when label is 1."""
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(40 if side == 32 else 10):
        label, strokes, dots = layout(rng, side, 8, 4, 0.35)
        image = render(side, strokes, dots)
        assert all(image[tuple(np.rint(d).astype(int))] == 255 for d in dots)
        points = np.concatenate(strokes)
        joined = component_of(points, dots[0], 2.3 * side / 32)
        assert joined[np.linalg.norm(points - dots[1], axis=-1) < 1e-9].any() == bool(label)
        assert joined.sum() == len(strokes[0])  # the first contour, whole, and nothing else
        labels.append(label)
    assert 0 < sum(labels) < len(labels)


def test_generator_options_are_checked():
    with pytest.raises(DataError) as caught:
        load_classification("pathfinder", side=512)
    assert str(caught.value) == ("dataset 'pathfinder': option side must be in [8, 256], got 512; pass --data-option "
                                 "side=VALUE with such a value, or leave it out (default 32)")


def write_release(root, n=10, side=16, difficulty_dir="curv_contour_length_14", bad_line=None):
    folder = root / difficulty_dir
    rng = np.random.default_rng(2)
    lines = {}
    for i in range(n):
        k, j = i // 4, i % 4
        (folder / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8)).save(folder / "imgs" / str(k) /
                                                                                  f"sample_{j}.png")
        lines.setdefault(k, []).append(f"imgs/{k} sample_{j}.png {i} {i % 3 == 0:d} 14 1.5 1 4 0.5")
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    for k, rows in lines.items():
        (folder / "metadata" / f"{k}.npy").write_text("\n".join(rows + ([bad_line] if bad_line and k == 1 else []))
                                                      + "\n")
    return folder


def test_release_folders_load(tmp_path):
    folder = write_release(tmp_path / "pathfinder16")
    data = load_classification("pathfinder", data_path=tmp_path / "pathfinder16")
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [8, 1, 1]
    assert data.max_len == 256 and data.metadata["difficulty"] == "hard"
    assert data.splits["train"].labels.tolist() == [1, 0, 0, 1, 0, 0, 1, 0]
    expected = np.asarray(Image.open(folder / "imgs" / "2" / "sample_1.png")).reshape(-1)  # image 9
    assert np.array_equal(np.asarray(data.splits["test"][0][0]), expected)
    same = load_classification("pathfinder", data_path=folder)  # the difficulty folder itself
    assert np.array_equal(np.asarray(same.splits["test"].tokens), expected)


def test_release_errors(tmp_path):
    write_release(tmp_path, bad_line="imgs/1 sample_9.png 9")
    with pytest.raises(DataError, match=r"1.npy:5: expected 'imgs/<k> sample_<j>.png <index> <label 0\|1> \.\.\.', "
                                        r"got 'imgs/1 sample_9.png 9'"):
        load_classification("pathfinder", data_path=tmp_path)
    with pytest.raises(DataError, match=r"no metadata/ folder in .* or .*curv_baseline; pass --data-path"):
        load_classification("pathfinder", data_path=tmp_path / "nothing", difficulty="easy")
    with pytest.raises(DataError, match=r"option difficulty must be one of easy, intermediate, hard, got 'extreme'"):
        load_classification("pathfinder", data_path=tmp_path, difficulty="extreme")
    write_release(tmp_path / "two")
    (tmp_path / "two" / "curv_contour_length_14" / "imgs" / "1" / "sample_2.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"cannot read image .*sample_2.png"):
        load_classification("pathfinder", data_path=tmp_path / "two")
