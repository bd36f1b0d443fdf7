"""``load_corpus`` / ``list_corpora``: names, options and errors."""

import pytest

from transformer_vq.data import Corpus, DataError, list_corpora, load_corpus


def test_all_paper_datasets_are_listed():
    assert set(list_corpora()) == {"shakespeare", "text", "enwik8", "pg19", "imagenet64", "gcide"}
    assert all(isinstance(d, str) and d for d in list_corpora().values())


def test_data_error_is_a_plain_exception():
    assert issubclass(DataError, Exception)


def test_unknown_name_and_option():
    with pytest.raises(DataError, match="unknown dataset 'wiki'; choose one of: shakespeare, text, enwik8"):
        load_corpus("wiki")
    with pytest.raises(DataError,
                       match="dataset 'text' has no option 'vocab'; its options are: glob, fractions, lines"):
        load_corpus("text", data_path="x", vocab=3)


def test_options_reach_the_loader(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"z" * 1000)
    corpus = load_corpus("text", data_path=path, fractions=(0.8, 0.1, 0.1))
    assert isinstance(corpus, Corpus) and len(corpus.splits["train"]) == 800


def test_cache_dir_argument_overrides_env(tmp_path, cache_dir):
    root = tmp_path / "d"
    root.mkdir()
    (root / "a").write_bytes(b"q" * 100)
    load_corpus("text", data_path=root, cache_dir=tmp_path / "explicit")
    assert list((tmp_path / "explicit" / "text").glob("*.bin")) and not (cache_dir / "text").exists()


@pytest.mark.parametrize("name", ["pg19", "imagenet64"])
def test_datasets_without_download_need_a_path(name):
    with pytest.raises(DataError, match=f"--data {name} needs the dataset: pass --data-path"):
        load_corpus(name)
