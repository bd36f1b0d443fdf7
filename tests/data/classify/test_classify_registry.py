"""The classification registry: the names the classification command uses, and its errors."""

import pytest

from transformer_vq.config.choices import CLASSIFY_DATASETS
from transformer_vq.data import DataError
from transformer_vq.data.classify import list_classification, load_classification
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
