"""Sequential images: Fashion-MNIST (IDX in a .deb), scikit-learn's digits, CIFAR-10 python batches."""

import gzip
import pickle
import sys

import numpy as np
import pytest
from classifyutil import write_deb

from transformer_vq.data import DataError
from transformer_vq.data.classify import load_classification
from transformer_vq.data.classify.cifar10 import to_grayscale

FASHION_DIR = "usr/share/datasets/fashion-mnist"


def idx_images(images: np.ndarray) -> bytes:
    n, rows, cols = images.shape
    return b"".join(x.to_bytes(4, "big") for x in (0x803, n, rows, cols)) + images.astype(np.uint8).tobytes()


def idx_labels(labels) -> bytes:
    return (0x801).to_bytes(4, "big") + len(labels).to_bytes(4, "big") + bytes(labels)


def fashion_files(n_train=6, n_test=3, **override):
    rng = np.random.default_rng(0)
    files = {"train-images-idx3-ubyte": idx_images(rng.integers(0, 256, (n_train, 28, 28))),
             "train-labels-idx1-ubyte": idx_labels([i % 10 for i in range(n_train)]),
             "t10k-images-idx3-ubyte": idx_images(rng.integers(0, 256, (n_test, 28, 28))),
             "t10k-labels-idx1-ubyte": idx_labels([9 - i for i in range(n_test)])}
    files.update(override)
    return {f"{FASHION_DIR}/{name}.gz": gzip.compress(data) for name, data in files.items()}, files


def test_fashion_mnist_from_a_deb_fetched_by_apt(tmp_path, cache_dir):
    packed, raw = fashion_files()
    deb = write_deb(tmp_path / "mirror" / "dataset-fashion-mnist_0.0-test_all.deb", "dataset-fashion-mnist", packed)
    fake_apt = (sys.executable, "-c", f"import shutil; shutil.copy({str(deb)!r}, '.')")
    data = load_classification("fashion-mnist", apt_command=fake_apt, use_dpkg=False, validation_size=2)
    assert (data.vocab_size, data.n_classes, data.max_len) == (256, 10, 784)
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [4, 2, 3]
    assert data.class_names[9] == "Ankle boot"
    tokens, label = data.splits["validation"][1]  # training image 5 in raster order
    assert bytes(np.asarray(tokens)) == raw["train-images-idx3-ubyte"][16 + 5 * 784:16 + 6 * 784] and label == 5
    assert data.splits["test"].labels.tolist() == [9, 8, 7]
    failing_apt = (sys.executable, "-c", "raise SystemExit('must not run again')")
    again = load_classification("fashion-mnist", apt_command=failing_apt, validation_size=2)
    assert np.array_equal(np.asarray(again.splits["test"].tokens), np.asarray(data.splits["test"].tokens))


def test_fashion_mnist_from_a_directory_of_plain_idx_files(tmp_path):
    _, raw = fashion_files()
    for name, data in raw.items():
        (tmp_path / name).write_bytes(data)
    # a stand-in, not the release: read only when its checksums are waived
    data = load_classification("fashion-mnist", data_path=tmp_path, validation_size=1, release_checksums=False)
    assert data.splits["train"][0][1] == 0 and len(data.splits["train"]) == 5


def test_a_folder_of_other_idx_files_is_not_read_as_fashion_mnist(tmp_path):
    """MNIST's files have Fashion-MNIST's names: a folder of them trained as Fashion-MNIST in silence, and files from
    several folders were mixed (helper-74 audit-data F3)."""
    _, raw = fashion_files()
    for name, data in raw.items():
        (tmp_path / "mnist" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mnist" / name).write_bytes(data)
    with pytest.raises(DataError, match=r"^train-images-idx3-ubyte in .*mnist is not Fashion-MNIST's \(sha256 \w+, "
                                        r"expected c59f468a\w+\): MNIST's files have the same names. For another "
                                        r"copy in this format, pass --data-option release_checksums=false$"):
        load_classification("fashion-mnist", data_path=tmp_path, validation_size=1)
    for name, data in raw.items():  # a second folder holding all four: which one is meant is not guessed
        (tmp_path / "copy" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "copy" / name).write_bytes(data)
    with pytest.raises(DataError, match=r"^2 folders under .* hold the four IDX files \(.*copy, .*mnist\); pass the "
                                        r"one to read as --data-path$"):
        load_classification("fashion-mnist", data_path=tmp_path, validation_size=1, release_checksums=False)
    (tmp_path / "copy" / "t10k-labels-idx1-ubyte").unlink()  # one whole folder, one partial: the whole one
    data = load_classification("fashion-mnist", data_path=tmp_path, validation_size=1, release_checksums=False)
    assert len(data.splits["train"]) == 5


@pytest.mark.parametrize("override, message", [
    ({"t10k-labels-idx1-ubyte": b"\x00\x00\x08\x03" + bytes(8)}, r"t10k-labels-idx1-ubyte: magic number 00000803, "
                                                                 r"expected 00000801"),
    ({"train-images-idx3-ubyte": idx_images(np.zeros((6, 28, 28)))[:-1]},
     r"train-images-idx3-ubyte: 4,719 bytes, expected 4,720 for dimensions \[6, 28, 28\]; the file is truncated"),
    ({"train-images-idx3-ubyte": idx_images(np.zeros((6, 32, 32)))}, r"images are 32x32, expected 28x28"),
    ({"train-labels-idx1-ubyte": idx_labels([1, 2])}, r"6 train images but 2 labels \(the release has 60,000"),
])
def test_fashion_mnist_malformed_files(tmp_path, override, message):
    packed, _ = fashion_files(**override)
    deb = write_deb(tmp_path / "dataset-fashion-mnist_0.0-test_all.deb", "dataset-fashion-mnist", packed)
    with pytest.raises(DataError, match=message):
        load_classification("fashion-mnist", data_path=deb, use_dpkg=False, validation_size=1)


def test_fashion_mnist_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"no folder under .* holds all four IDX files: no train-images-idx3-ubyte"
                                        r"\(\.gz\) beside the others; pass --data-path with dataset-fashion-mnist_"
                                        r"\*\.deb"):
        load_classification("fashion-mnist", data_path=tmp_path)


def test_digits_from_scikit_learn():
    pytest.importorskip("sklearn")
    data = load_classification("digits", seed=0)
    assert (data.vocab_size, data.n_classes, data.max_len) == (17, 10, 64)
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [1257, 180, 360]
    from sklearn.datasets import load_digits

    bunch = load_digits()
    order = np.random.default_rng(0).permutation(1797)
    tokens, label = data.splits["test"][0]
    assert np.array_equal(np.asarray(tokens), bunch.data[order[0]].astype(int)) and label == bunch.target[order[0]]


def test_digits_names_the_extra_when_scikit_learn_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(DataError, match=r"install the extra: pip install -e '\.\[digits\]' in the checkout \(or pip "
                                        r"install scikit-learn\)"):
        load_classification("digits")


def write_cifar(root, n=4, labels=None, data=None, keys=("data", "labels")):
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {keys[0]: rng.integers(0, 256, (n, 3072), dtype=np.uint8) if data is None else data,
                 keys[1]: [i % 10 for i in range(n)] if labels is None else labels, "batch_label": name}
        (root / name).write_bytes(pickle.dumps(batch, protocol=4))
    return root


def test_cifar10_grayscale_and_rgb(tmp_path):
    root = write_cifar(tmp_path / "cifar-10-batches-py")
    gray = load_classification("cifar10", data_path=tmp_path, validation_size=4)
    rgb = load_classification("cifar10", data_path=tmp_path, validation_size=4, grayscale=False)
    assert (gray.max_len, rgb.max_len, gray.vocab_size, gray.class_names[0]) == (1024, 3072, 256, "airplane")
    assert [len(gray.splits[s]) for s in ("train", "validation", "test")] == [16, 4, 4]
    planar = pickle.loads((root / "data_batch_2").read_bytes())["data"]
    tokens, label = rgb.splits["train"][5]  # batch 2, image 1
    r, g, b = planar[1, :1024], planar[1, 1024:2048], planar[1, 2048:]
    assert np.asarray(tokens)[:6].tolist() == [r[0], g[0], b[0], r[1], g[1], b[1]] and label == 1
    expected = np.floor((0.2989 * r + 0.5870 * g + 0.1140 * b) / 255 * 255.5).astype(int)
    difference = np.abs(np.asarray(gray.splits["train"][5][0]).astype(int) - expected)
    # float32 (TensorFlow's precision) vs float64 here: a value on a level boundary may round apart
    assert difference.max() <= 1 and (difference == 0).mean() > 0.99


def test_grayscale_matches_tensorflow_on_known_pixels():
    # rgb_to_grayscale of pure white, pure red and a mid gray, computed by hand from TF's formula.
    planar = np.array([[255] * 1024 + [255] * 1024 + [255] * 1024, [255] * 1024 + [0] * 2048,
                       [128] * 3072], dtype=np.uint8)
    assert to_grayscale(planar)[:, 0].tolist() == [255, 76, 128]


@pytest.mark.parametrize("kwargs, message", [
    (dict(data=np.zeros((4, 1024), dtype=np.uint8)), r"'data' has shape \(4, 1024\) and dtype uint8, expected "
                                                      r"\[N, 3072\] uint8"),
    (dict(labels=[0, 1, 2, 10]), r"'labels' must be 4 integers 0..9"),
    (dict(keys=("pixels", "labels")), r"is not a CIFAR-10 batch \(a pickled dict with 'data' and 'labels'\)"),
])
def test_cifar10_malformed_batches(tmp_path, kwargs, message):
    write_cifar(tmp_path, **kwargs)
    with pytest.raises(DataError, match=message):
        load_classification("cifar10", data_path=tmp_path, validation_size=1)


def test_cifar10_refuses_code_and_missing_files(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(DataError, match=r"refusing to load global os.system: only numpy arrays are allowed\); it was "
                                        r"not loaded\. The release's batches hold only arrays and lists: download"):
        load_classification("cifar10", data_path=tmp_path, validation_size=1)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(DataError, match=r"no test_batch under .*; download cifar-10-python.tar.gz"):
        load_classification("cifar10", data_path=tmp_path)
    with pytest.raises(DataError, match=r"cifar10 is not fetched automatically; download cifar-10-python.tar.gz"):
        load_classification("cifar10")
