"""Dataset options: each declared once in its loader's signature (type, and range for every number), checked against
that declaration before the loader does any work, with a message naming the dataset, the option, the value and the
rule."""

from __future__ import annotations

import inspect
import typing

import pytest

from transformer_vq.cli import main
from transformer_vq.data import DataError, load_corpus
from transformer_vq.data.classify.registry import DATASETS, classification_loader, load_classification
from transformer_vq.data.options import NOT_OPTIONS, declared
from transformer_vq.data.registry import CORPORA, PROBES, loader

LOADERS = {**{n: loader(n) for n in (*CORPORA, *PROBES)}, **{n: classification_loader(n) for n in DATASETS}}


@pytest.mark.parametrize("name", LOADERS)
def test_every_option_has_a_type_and_every_number_a_range(name):
    function = LOADERS[name]
    hints = typing.get_type_hints(function)
    for option, (kind, rules) in declared(function).items():
        assert option in hints, f"{name}: option {option} has no annotation"
        if kind.base in (int, float):
            assert "min" in rules or "max" in rules, f"{name}: numeric option {option} declares no range"
    assert set(declared(function)) == set(inspect.signature(function).parameters) - set(NOT_OPTIONS)


@pytest.mark.parametrize("name, options, message", [
    ("recall", dict(n_pairs=0), "option n_pairs must be a positive integer, got 0; pass --data-option "
                                "n_pairs=VALUE with such a value, or leave it out (default 8)"),
    ("recall", dict(n_pairs="2k"), "option n_pairs must be an integer, got '2k'"),
    ("recall", dict(seed=-1), "option seed must be an integer >= 0, got -1"),
    ("recall", dict(n_pairs=2.5), "option n_pairs must be an integer, got 2.5"),
    ("recall", dict(filler="zeros"), "option filler must be one of pattern, random, text, got 'zeros'"),
    ("listops", dict(n_train=0), "option n_train must be a positive integer, got 0"),
    ("pathfinder", dict(curvature=-1.0), "option curvature must be >= 0, got -1.0"),
    ("cifar10", dict(grayscale="maybe"), "option grayscale must be true or false, got 'maybe'"),
    ("imdb", dict(max_len=0), "option max_len must be a positive integer, got 0"),
])
def test_values_outside_their_declaration_are_refused_before_any_work(name, options, message):
    load = load_corpus if name in (*CORPORA, *PROBES) else load_classification
    with pytest.raises(DataError) as caught:
        load(name, **options)
    assert str(caught.value).startswith(f"dataset {name!r}: {message}")


def test_text_from_the_command_line_becomes_the_declared_type():
    corpus = load_corpus("recall", n_pairs="2", n_queries="2", seq_len=64, train_episodes="2", eval_episodes=2)
    assert corpus.metadata["spec"]["n_pairs"] == 2 and corpus.metadata["episodes"]["train"] == 2


def test_tvq_train_refuses_a_bad_data_option_before_touching_the_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--data", "recall", "--data-option", "n_pairs=0", "--run-dir", str(run_dir)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: dataset 'recall': option n_pairs must be a positive integer, got 0; pass --data-option n_pairs=VALUE "
        "with such a value, or leave it out (default 8)")
    assert not run_dir.exists()
