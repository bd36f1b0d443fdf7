"""A first build of the cache says what it builds and where, then how far it has come, on stderr (a bar on a terminal,
plain lines elsewhere); a load from the cache says nothing."""

import re
import time

import pytest

from transformer_vq.data import load_corpus, progress
from transformer_vq.data.classify import load_classification

LISTOPS = dict(n_train=6, n_validation=2, n_test=2, min_length=5, max_length=40, max_depth=4, max_args=4)


@pytest.fixture
def every_item(monkeypatch):
    """A progress line for every item counted (one every 30 seconds, in real builds)."""
    monkeypatch.setattr(progress, "PERIOD_S", 0.0)
    monkeypatch.setattr(progress, "on_terminal", lambda: False)  # pytest's stderr is no terminal, but a run may be


def building_line(err: str, what: str, cache_dir, dataset: str) -> str:
    """The first line of ``err``, checked to name ``what`` and a place in the dataset's cache."""
    first = err.splitlines()[0]
    assert re.fullmatch(rf"building {re.escape(what)}, cached at {re.escape(str(cache_dir / dataset))}/\S+", first), \
        first
    return first


def test_a_generated_classification_dataset_says_its_build_once(cache_dir, capsys, every_item):
    load_classification("listops", **LISTOPS)
    err = capsys.readouterr().err
    building_line(err, "listops (10 expressions)", cache_dir, "listops")
    lines = err.splitlines()[1:]
    assert [re.match(r"listops: (\d+)/10 expressions \(\d+%\), \d+ s", line).group(1) for line in lines[:-1]] == \
        [str(n) for n in range(1, 11)]
    assert re.fullmatch(r"listops: built, 10 expressions in \d+ s", lines[-1])
    load_classification("listops", **LISTOPS)  # from the cache
    assert capsys.readouterr().err == ""


def test_pathfinder_generation_counts_its_images(cache_dir, capsys, every_item):
    load_classification("pathfinder", n_train=2, n_validation=1, n_test=1, side=16, dashes=3, distractors=0)
    err = capsys.readouterr().err
    building_line(err, "pathfinder (4 images)", cache_dir, "pathfinder")
    assert "pathfinder: 4/4 images (100%)" in err


def test_a_text_directory_says_its_concatenation_once(tmp_path, cache_dir, capsys, every_item):
    books = tmp_path / "books"
    books.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (books / name).write_text(name * 100)
    load_corpus("text", data_path=books)
    err = capsys.readouterr().err
    building_line(err, f"text of {books} (3 files)", cache_dir, "text")
    assert f"text of {books}: 3/3 files (100%)" in err
    load_corpus("text", data_path=books)
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_a_bar_and_no_lines(cache_dir, capsys, monkeypatch):
    monkeypatch.setattr(progress, "PERIOD_S", 0.0)
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    load_classification("listops", **LISTOPS)
    err = capsys.readouterr().err
    building_line(err, "listops (10 expressions)", cache_dir, "listops")
    assert "0/10" in err and "\r" in err  # tqdm's bar, drawn in place
    assert "listops: 1/10" not in err and "built" not in err


def test_a_quick_build_off_a_terminal_says_only_its_first_line(capsys):
    with progress.building("thing", "/cache/thing", 3, "item") as advance:
        advance(3)  # well within PERIOD_S
    assert capsys.readouterr().err == "building thing (3 items), cached at /cache/thing\n"


def test_a_count_without_a_total_and_the_time_left():
    unknown, known = progress.Progress("aan", None, "pair"), progress.Progress("pg19 train split", 400, "book")
    unknown.done, known.done = 1, 100
    unknown.start = known.start = time.monotonic() - 120  # started two minutes ago
    assert unknown.line() == "aan: 1 pair, 2 min"
    assert known.line() == "pg19 train split: 100/400 books (25%), 2 min, about 6 min left"
    known.start = time.monotonic() - 20
    assert known.line() == "pg19 train split: 100/400 books (25%), 20 s, about 60 s left"


def test_only_the_first_torchrun_worker_of_a_machine_speaks(cache_dir, capsys, monkeypatch, every_item):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("LOCAL_RANK", "1")
    load_classification("listops", **LISTOPS)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    load_classification("listops", seed=1, **LISTOPS)
    assert capsys.readouterr().err.startswith("building listops (10 expressions)")
