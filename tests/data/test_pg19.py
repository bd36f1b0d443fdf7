"""PG-19 with an exact-round-trip SentencePiece tokenizer, on a small tree laid out like the release."""

import os
from pathlib import Path

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus
from transformer_vq.data.metrics import count_words
from transformer_vq.data.pg19 import default_tokenizer_path, tokenize_split, train_pg19_tokenizer
from transformer_vq.data.tokenizer import EOD_ID, ExactTokenizer

PARAGRAPH = ("CHAPTER {i}.\n\nIt was the best of times, it was the worst of times; in the year 18{i:02d} the\n"
             "  coach  rolled on,\tand   Mr. Lorry said: \"Recalled to life.\"\r\n\n")
TRAIN = {f"{100 + i}.txt": "".join(PARAGRAPH.format(i=(i * 7 + j) % 100) for j in range(30)) for i in range(4)}
VALIDATION = {"200.txt": "A short book — with “quotes”, naïve café, 日本語 and ▁ the space symbol.\n"}
TEST = {"300.txt": "  Leading spaces, trailing spaces  \n\n\n", "301.txt": "Second book\twith tabs\x00and a NUL.",
        "302.txt": "▁▁ starts with two U+2581 and ends with an emoji 🎉"}
TRICKY = ["", " ", "  ", "\n", "\r\n", "\t\t", "▁", "x▁y", " ▁ ", "a  b   c", "\u00a0nbsp\u3000wide", "e\u0301",
          "ﬁ ligature Ⅻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "12345.678", "\x00\x01\x7f", "A\u2028B\u2029C", "\ufeffBOM", "تشكيل", "trailing "]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "pg19"
    for split, books in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST)):
        (root / split).mkdir(parents=True)
        for name, text in books.items():
            (root / split / name).write_bytes(text.encode("utf-8"))
    (root / "metadata.csv").write_text("id,title\n")
    return root


@pytest.fixture
def tokenizer(tree):
    return train_pg19_tokenizer(tree, vocab_size=400, num_threads=1)


def test_tokenizer_round_trips_exactly(tokenizer):
    assert tokenizer.eod_id == EOD_ID and tokenizer.vocab_size == 400
    for text in TRICKY + list(TRAIN.values()) + list(VALIDATION.values()) + list(TEST.values()):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text, repr(text)
        assert 0 not in ids  # byte fallback: never <unk>
    # the saved model behaves the same
    again = ExactTokenizer.load(tokenizer.path)
    assert again.encode(TRICKY[9]) == tokenizer.encode(TRICKY[9]) and again.sha256 == tokenizer.sha256


def test_tokenizer_rejects_lone_surrogates(tokenizer):
    with pytest.raises(DataError, match="valid Unicode without lone surrogates"):
        tokenizer.encode("bad \udc80 text")


def test_corpus(tree, tokenizer, cache_dir):
    corpus = load_corpus("pg19", data_path=tree, vocab_size=400)
    assert corpus.vocab_size == 400 and corpus.eod_id == EOD_ID
    for split, books in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST)):
        tokens = corpus.splits[split]
        assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
        # books in sorted order, each followed by the end-of-document token
        assert int(tokens[-1]) == EOD_ID and int(np.sum(tokens == EOD_ID)) == len(books)
        starts = corpus.documents[split]
        assert len(starts) == len(books) and starts[0] == 0
        ends = list(starts[1:]) + [len(tokens)]
        for (name, text), begin, end in zip(sorted(books.items()), starts, ends):
            assert int(tokens[end - 1]) == EOD_ID
            assert corpus.decode(tokens[begin:end - 1]) == text
        assert corpus.split_bytes[split] == sum(len(t.encode("utf-8")) for t in books.values())
        assert corpus.metadata["split_words"][split] == sum(len(t.split()) for t in books.values())
    assert corpus.splits["test"][0] == tokenizer.encode(TEST["300.txt"])[0]
    assert corpus.metadata["tokenizer"] == str(tokenizer.path.resolve())
    assert corpus.metadata["split_books"] == {"train": 4, "validation": 1, "test": 3}
    # tokenized once: the second load reads the cached .npy files
    cached = sorted(p.name for p in (cache_dir / "pg19").rglob("*.npy"))
    assert cached == sorted(f"{s}{suffix}" for s in ("train", "validation", "test") for suffix in (".npy", ".docs.npy"))
    again = load_corpus("pg19", data_path=tree, vocab_size=400)
    assert np.array_equal(again.splits["train"], corpus.splits["train"])


def test_explicit_tokenizer_path(tree, tmp_path):
    model = tmp_path / "my.model"
    train_pg19_tokenizer(tree, model, vocab_size=350, num_threads=1)
    corpus = load_corpus("pg19", data_path=tree, tokenizer=model)
    assert corpus.vocab_size == 350 and corpus.decode(corpus.encode(VALIDATION["200.txt"])) == VALIDATION["200.txt"]


def test_too_small_vocabulary(tree, tmp_path):
    with pytest.raises(DataError, match="vocab_size=100 is too small"):
        train_pg19_tokenizer(tree, tmp_path / "x.model", vocab_size=100)
    with pytest.raises(DataError, match="Vocabulary size is smaller than required_chars.*Use a larger --vocab-size"):
        train_pg19_tokenizer(tree, tmp_path / "x.model", vocab_size=300)
    with pytest.raises(DataError, match="max_sentences=100 is too small: SentencePiece samples more than 100 lines"):
        train_pg19_tokenizer(tree, tmp_path / "x.model", vocab_size=350, max_sentences=100)


def test_a_size_the_text_cannot_reach_is_refused_not_trained_smaller(tree, tmp_path, cache_dir):
    """SentencePiece's soft limit gave fewer pieces than asked without a word, saved in the cache under the size
    asked (where vocab_size=N then found a tokenizer of another size)."""
    with pytest.raises(DataError) as error:
        train_pg19_tokenizer(tree, vocab_size=5000, num_threads=1)
    message = str(error.value)
    reached = int(message.split("at most ")[1].split()[0])
    lines = sum(len(text.split("\n")) for text in TRAIN.values())
    assert message == (f"--vocab-size 5000 is more than the training text supports: SentencePiece can form at most "
                       f"{reached} pieces from its {lines} lines; pass --vocab-size {reached} or less, or train on "
                       f"more text (nothing was saved)")
    assert not list((cache_dir / "pg19").glob("tokenizer-*"))
    with pytest.raises(DataError, match=rf"from the 200 lines sampled \(--max-sentences\) of its {lines}; pass "
                                        rf"--vocab-size \d+ or less, or raise --max-sentences \(nothing was saved\)"):
        train_pg19_tokenizer(tree, tmp_path / "x.model", vocab_size=5000, max_sentences=200, num_threads=1)
    assert train_pg19_tokenizer(tree, vocab_size=reached, num_threads=1).vocab_size == reached


def test_an_existing_out_is_refused_not_overwritten(tree, tmp_path):
    model = tmp_path / "x.model"
    first = train_pg19_tokenizer(tree, model, vocab_size=350, num_threads=1)
    with pytest.raises(DataError, match=r"--out: .*x.model exists already; pass a new path, or remove it first "
                                        r"\(nothing is overwritten\)"):
        train_pg19_tokenizer(tree, model, vocab_size=400, num_threads=1)
    assert ExactTokenizer.load(model).sha256 == first.sha256
    with pytest.raises(DataError, match="is a directory; pass the path of the .model file to write"):
        train_pg19_tokenizer(tree, tmp_path, vocab_size=350, num_threads=1)


def test_missing_tokenizer_says_where_it_looked_and_how_to_use_one_saved_elsewhere(tree, cache_dir):
    """Not only "train a 32,000-piece one" (and a Python call): the tokenizer may exist elsewhere (`tvq tokenizer --out`
    or --cache-dir), and `tvq train` takes it with --data-option tokenizer=PATH."""
    with pytest.raises(DataError) as error:
        load_corpus("pg19", data_path=tree)
    assert str(error.value) == (
        f"no 32000-piece tokenizer has been trained for {tree} yet: none is in {cache_dir / 'pg19'}, where `tvq "
        f"tokenizer --data-path {tree}` saves it. Use one saved elsewhere (`tvq tokenizer --out` or --cache-dir) with "
        f"--data-option tokenizer=PATH (Python: load_corpus('pg19', ..., tokenizer=PATH)), or train it: `tvq "
        f"tokenizer --data-path {tree} --vocab-size 32000`")


def test_the_only_trained_tokenizer_is_found(tree):
    train_pg19_tokenizer(tree, vocab_size=350, num_threads=1)
    assert load_corpus("pg19", data_path=tree).vocab_size == 350  # no vocab_size needed
    with pytest.raises(DataError, match=r"no 400-piece tokenizer has been trained for .* yet \(trained here: 350; "):
        load_corpus("pg19", data_path=tree, vocab_size=400)
    train_pg19_tokenizer(tree, vocab_size=400, num_threads=1)
    with pytest.raises(DataError, match=r"\(trained here: 350, 400; choose one with --data-option vocab_size=N\)"):
        load_corpus("pg19", data_path=tree)
    bogus = tree / "bogus.model"
    bogus.write_bytes(b"not a model")
    with pytest.raises(DataError, match="is not a SentencePiece model"):
        load_corpus("pg19", data_path=tree, tokenizer=bogus)


def test_malformed_trees(tree):
    for path in (tree / "validation").iterdir():
        path.unlink()
    with pytest.raises(DataError, match=r"validation contains no .txt books"):
        load_corpus("pg19", data_path=tree)
    (tree / "validation").rmdir()
    with pytest.raises(DataError, match=r"has no validation/ directory \(expected train/, validation/ and test/"):
        load_corpus("pg19", data_path=tree)
    with pytest.raises(DataError, match="is not a directory; pass --data-path with the directory holding train/"):
        load_corpus("pg19", data_path=tree / "nope")


def test_invalid_utf8_book(tree, tokenizer):
    (tree / "test" / "399.txt").write_bytes(b"caf\xe9 in latin-1")
    with pytest.raises(DataError, match=r"399.txt is not valid UTF-8 .* re-download the file"):
        load_corpus("pg19", data_path=tree, vocab_size=400)


def test_default_tokenizer_path_follows_the_training_files(tree, cache_dir):
    first = default_tokenizer_path(tree, 400)
    assert first.parent == cache_dir / "pg19" and first.name.startswith("tokenizer-400-")
    (tree / "train" / "999.txt").write_text("another book")
    assert default_tokenizer_path(tree, 400) != first


def test_word_count_of_original_text():
    assert count_words(TEST["300.txt"]) == 4


def test_tokenizing_says_each_split_and_counts_its_books_once(tree, tokenizer, cache_dir, capsys, monkeypatch):
    from transformer_vq.data import progress

    monkeypatch.setattr(progress, "PERIOD_S", 0.0)  # a line for every batch of books
    monkeypatch.setattr(progress, "on_terminal", lambda: False)
    capsys.readouterr()
    load_corpus("pg19", data_path=tree, vocab_size=400)
    lines = capsys.readouterr().err.splitlines()
    for split, books in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST)):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"building pg19 {split} split"))
        n = len(books)
        assert lines[start] == (f"building pg19 {split} split ({n} book{'s' * (n > 1)}), cached at "
                                f"{next((cache_dir / 'pg19').rglob(f'{split}.npy'))}")
        assert lines[start + 1].startswith(f"pg19 {split} split: {n}/{n} book{'s' * (n > 1)} (100%), ")
    load_corpus("pg19", data_path=tree, vocab_size=400)
    assert capsys.readouterr().err == ""


def test_two_builds_of_one_split_at_once_each_get_the_whole_split(tree, tokenizer, tmp_path, monkeypatch):
    """The workers of a first torchrun on a fresh cache tokenize the same split at the same time. A second build that
    runs whole just as the first publishes its ``.npy`` must leave both whole: fixed temporary names made one worker
    read a scratch file another had deleted ("No such file or directory: ...npy.tokens", ".train.npy.tmp") or map a
    ``.npy`` still being written ("mmap length is greater than file size")."""
    books = sorted((tree / "train").glob("*.txt"))
    out = tmp_path / "built" / "train.npy"
    inner, replace = {}, os.replace

    def racing_replace(src, dst, **kwargs):  # the second build runs whole as the first renames onto out
        if Path(dst) == out and not inner:
            inner["manifest"] = {}  # the nested build renames onto out too: race once
            inner["manifest"] = tokenize_split(books, tokenizer, out)
            inner["tokens"] = np.load(out).copy()
        return replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", racing_replace)
    outer = tokenize_split(books, tokenizer, out)
    tokens = np.load(out)
    assert inner["manifest"] == outer and np.array_equal(tokens, inner["tokens"])
    assert int(np.sum(tokens == EOD_ID)) == len(books) and outer["tokens"] == len(tokens)
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.docs.npy", "train.npy", "train.npy.json"]
