"""The classification registry: the names the classification command uses, and its errors."""

import pytest

from transformer_vq.config.choices import CLASSIFY_DATASETS
from transformer_vq.data import DataError
from transformer_vq.data.classify import dataset_identity, list_classification, load_classification
from transformer_vq.data.classify.registry import classification_loader


def test_every_name_has_a_loader():
    assert tuple(list_classification()) == CLASSIFY_DATASETS == (
        "listops", "fashion-mnist", "digits", "cifar10", "pathfinder", "imdb", "aan")
    for name in CLASSIFY_DATASETS:
        assert callable(classification_loader(name))


def test_unknown_names_and_options():
    with pytest.raises(DataError, match=r"unknown classification dataset 'mnist'; choose one of: listops, "
                                        r"fashion-mnist, digits, cifar10, pathfinder, imdb, aan"):
        load_classification("mnist")
    with pytest.raises(DataError, match=r"dataset 'cifar10' has no option 'side'; its options are: grayscale, "
                                        r"validation_size"):
        load_classification("cifar10", side=32)


WITHOUT = ("dataset {name!r}: option {key} applies only without --data-path (it shapes the generated or fetched "
           "data) and --data-path was given; leave --data-option {key} out, or leave out --data-path")
WITH = ("dataset 'pathfinder': option difficulty applies only with --data-path (it picks among the released files) "
        "and none was given; leave --data-option difficulty out, or pass --data-path with the release")


@pytest.mark.parametrize("name, key, value", [
    ("listops", "n_train", 5), ("listops", "max_length", 4), ("listops", "seed", 1),
    ("pathfinder", "side", 16), ("pathfinder", "curvature", 0.1), ("fashion-mnist", "apt_command", ["apt-get"])])
def test_a_generator_option_is_refused_with_a_data_path(tmp_path, name, key, value):
    """The loader would ignore it (it reads the release) and the run would record it: refused before any work."""
    with pytest.raises(DataError) as caught:
        load_classification(name, data_path=tmp_path / "nowhere", **{key: value})
    assert str(caught.value) == WITHOUT.format(name=name, key=key)


def test_pathfinders_difficulty_is_refused_for_generated_images():
    """It only picks a released folder: generated images would be those of the default, whatever it says."""
    with pytest.raises(DataError) as caught:
        load_classification("pathfinder", n_train=2, difficulty="easy")
    assert str(caught.value) == WITH


def test_a_datasets_identity_fills_in_the_defaults(tmp_path):
    assert dataset_identity("digits", None, {"seed": "5"}) == {
        "data": "digits", "data_path": None, "data_options": {"seed": 5, "validation_size": 180, "test_size": 360}}
    # an option given at its default, or as text, loads the same data as one left out; a relative path, the same
    assert dataset_identity("listops", None, {"n_train": "96000"}) == dataset_identity("listops")
    assert dataset_identity("aan", tmp_path / "a")["data_path"] == str((tmp_path / "a").resolve())
