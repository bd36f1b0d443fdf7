"""ImageNet64, proven on small batches in the downsampled-ImageNet release layout."""

import os
import pickle
import re

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus
from transformer_vq.data.imagenet64 import IMAGE_TOKENS, planar_to_raster

OPTIONS = dict(validation_every=4, expected_train_batches=None, expected_images=None)


def planar_images(first_id, n):
    """n channel-planar images; image k has R = id, G = row, B = column (id = first_id + k)."""
    rows, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    images = []
    for k in range(n):
        planes = np.stack([np.full((64, 64), (first_id + k) % 256), rows, cols]).astype(np.uint8)
        images.append(planes.reshape(-1))  # R plane, then G plane, then B plane, each row-major
    return np.stack(images)


def write_release(root, sizes=(6, 5), val=3, npz=True):
    """train_data_batch_1..K and val_data, like the unzipped Imagenet64_*_npz.zip files."""
    root.mkdir(parents=True, exist_ok=True)
    first = 0
    for k, n in enumerate(sizes, start=1):
        data = planar_images(first, n)
        save(root / f"train_data_batch_{k}", npz, data=data, labels=np.arange(1, n + 1), mean=data.mean(0))
        first += n
    save(root / "val_data", npz, data=planar_images(200, val), labels=np.ones(val, dtype=np.int64))
    return root


def save(path, npz, **arrays):
    if npz:
        np.savez(path.with_suffix(".npz"), **arrays)
    else:
        with open(path, "wb") as handle:
            pickle.dump({k: (v.tolist() if k == "labels" else v) for k, v in arrays.items()}, handle)


def image_ids(split):
    return [int(split[i * IMAGE_TOKENS]) for i in range(len(split) // IMAGE_TOKENS)]


@pytest.mark.parametrize("npz", [True, False], ids=["npz", "pickle"])
def test_splits_and_raster_order(tmp_path, npz):
    corpus = load_corpus("imagenet64", data_path=write_release(tmp_path / "in64", npz=npz), **OPTIONS)
    assert corpus.vocab_size == 256 and corpus.metadata["images"] == {"train": 9, "validation": 2, "test": 3}
    # every 4th training image (global index 3, 7) is held out; the official val set is the test split
    assert image_ids(corpus.splits["train"]) == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert image_ids(corpus.splits["validation"]) == [3, 7]
    assert image_ids(corpus.splits["test"]) == [200, 201, 202]
    assert corpus.split_bytes["train"] == 9 * IMAGE_TOKENS
    # raster order: token (row, col, channel) at (row * 64 + col) * 3 + channel
    image = np.asarray(corpus.splits["test"][IMAGE_TOKENS:2 * IMAGE_TOKENS]).reshape(64, 64, 3)
    assert image[5, 9].tolist() == [201, 5, 9] and image[63, 0].tolist() == [201, 63, 0]
    assert corpus.splits["test"][-1] == 63  # last token: blue of the bottom-right pixel = its column
    assert corpus.documents["validation"].tolist() == [0, IMAGE_TOKENS]
    assert corpus.metadata["image_shape"] == [64, 64, 3] and corpus.metadata["absolute_positions"] is True


def test_planar_to_raster_is_channel_interleaving():
    rows = np.arange(2 * IMAGE_TOKENS, dtype=np.int64).reshape(2, IMAGE_TOKENS) % 251
    out = planar_to_raster(rows)
    r, c = 7, 11
    for ch in range(3):
        assert out[1, (r * 64 + c) * 3 + ch] == rows[1, ch * 4096 + r * 64 + c]


def test_conversion_is_cached(tmp_path, cache_dir):
    root = write_release(tmp_path / "in64")
    load_corpus("imagenet64", data_path=root, **OPTIONS)
    bins = sorted(cache_dir.rglob("*.bin"))
    stamps = [p.stat().st_mtime_ns for p in bins]
    load_corpus("imagenet64", data_path=root, **OPTIONS)
    assert [p.stat().st_mtime_ns for p in sorted(cache_dir.rglob("*.bin"))] == stamps


def test_npz_preferred_and_nested_directories(tmp_path):
    root = write_release(tmp_path / "in64" / "Imagenet64_train_part1_npz")
    (root / "train_data_batch_1").write_bytes(b"an older pickled copy, ignored")
    corpus = load_corpus("imagenet64", data_path=tmp_path / "in64", **OPTIONS)
    assert corpus.metadata["images"]["test"] == 3


def test_wrong_array_shape(tmp_path):
    root = write_release(tmp_path / "in64")
    np.savez(root / "train_data_batch_2.npz", data=np.zeros((4, 64, 64, 3), dtype=np.uint8))
    with pytest.raises(DataError, match=r"'data' has shape \(4, 64, 64, 3\) and dtype uint8, "
                                        r"expected \[N, 12288\] uint8"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)
    np.savez(root / "train_data_batch_2.npz", data=np.zeros((4, IMAGE_TOKENS), dtype=np.float32))
    with pytest.raises(DataError, match=r"dtype float32, expected \[N, 12288\] uint8"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)
    np.savez(root / "train_data_batch_2.npz", images=np.zeros((4, IMAGE_TOKENS), dtype=np.uint8))
    with pytest.raises(DataError, match=r"has no 'data' array \(keys: images\)"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)


def test_missing_files(tmp_path):
    root = write_release(tmp_path / "in64", sizes=(3, 3, 3))
    (root / "train_data_batch_2.npz").unlink()
    with pytest.raises(DataError, match="training batches train_data_batch_2 are missing"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)
    root = write_release(tmp_path / "b")
    (root / "val_data.npz").unlink()
    with pytest.raises(DataError, match=r"no val_data\(.npz\) under .*the official validation set is the test split"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no train_data_batch_\\* files under"):
        load_corpus("imagenet64", data_path=tmp_path / "empty", **OPTIONS)


def test_release_size_checks(tmp_path):
    root = write_release(tmp_path / "in64")
    with pytest.raises(DataError, match=r"found train_data_batch_1..2 .* the release has 10 batches: unzip both"):
        load_corpus("imagenet64", data_path=root)
    with pytest.raises(DataError, match=r"holds 11 training and 3 validation images; "
                                        r"the release has 1,281,167 and 50,000"):
        load_corpus("imagenet64", data_path=root, expected_train_batches=2)


def test_truncated_npz(tmp_path):
    root = write_release(tmp_path / "in64")
    path = root / "val_data.npz"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(DataError, match="cannot read .*val_data.npz as an .npz file"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_a_damaged_member_of_a_whole_npz_is_one_line_naming_the_file(tmp_path, compressed):
    """The zip's directory and the member's header read fine; the damage surfaces only as the images are read (a bad
    CRC, or a deflate stream that does not decode): once a zipfile.BadZipFile / zlib.error traceback (helper-74
    audit-data F4), on the real release after hours of converting the files before it."""
    root = write_release(tmp_path / "in64")
    path = root / "val_data.npz"
    if compressed:
        arrays = dict(np.load(path))
        path.unlink()
        np.savez_compressed(path, **arrays)
    raw = bytearray(path.read_bytes())
    middle = raw.index(b"data.npy") + 400  # inside data.npy's images, past its header
    raw[middle:middle + 64] = bytes(255 - b for b in raw[middle:middle + 64])
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"cannot read .*val_data.npz as an .npz file \(.*\); it is corrupt"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)


def test_pickle_with_code_payload_is_refused_and_never_runs(tmp_path):
    root = write_release(tmp_path / "in64", npz=False)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(root / "val_data", "wb") as handle:
        pickle.dump({"data": Payload()}, handle)
    with pytest.raises(DataError, match=r"is not a plain pickled dict of numpy arrays "
                                        r"\(refusing to load global (posix|os|nt)\.system"):
        load_corpus("imagenet64", data_path=root, **OPTIONS)
    assert not marker.exists()


def test_the_conversion_says_itself_and_counts_the_images_once(tmp_path, cache_dir, capsys, monkeypatch):
    from transformer_vq.data import progress

    monkeypatch.setattr(progress, "PERIOD_S", 0.0)  # a line for every chunk of images
    monkeypatch.setattr(progress, "on_terminal", lambda: False)
    root = write_release(tmp_path / "in64")
    load_corpus("imagenet64", data_path=root, **{**OPTIONS, "expected_images": (11, 3)})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"building imagenet64 (14 images), cached at {next((cache_dir / 'imagenet64').iterdir())}"
    counts = [f"imagenet64: {n}/14 images ({100 * n / 14:.0f}%), S, about S left" for n in (6, 11)]  # 6 + 5 train
    assert [re.sub(r"\d+ s\b", "S", line) for line in lines[1:]] == \
        counts + ["imagenet64: 14/14 images (100%), S", "imagenet64: built, 14 images in S"]
    load_corpus("imagenet64", data_path=root, **OPTIONS)
    assert capsys.readouterr().err == ""
