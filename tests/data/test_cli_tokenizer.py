"""`tvq tokenizer`: trains and saves where `--data pg19` finds the model."""

import argparse

from transformer_vq.cli import SUBCOMMANDS
from transformer_vq.cli import tokenizer as cli
from transformer_vq.data import load_corpus


def parse(argv):
    parser = argparse.ArgumentParser(prog="tvq")
    cli.add_parser(parser.add_subparsers()).set_defaults(_run=cli.run)
    return parser.parse_args(argv)


def make_tree(root):
    for split in ("train", "validation", "test"):
        (root / split).mkdir(parents=True)
        (root / split / "1.txt").write_text(f"The {split} book.\nIt has a few lines of text.\n" * 20)
    return root


def test_registered():
    assert SUBCOMMANDS["tokenizer"] == "transformer_vq.cli.tokenizer"


def test_trains_into_the_default_location(tmp_path, capsys):
    root = make_tree(tmp_path / "pg19")
    assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", "320", "--threads", "1"])) == 0
    out = capsys.readouterr().out
    assert "BPE tokenizer" in out and f"next: tvq train --data pg19 --data-path {root} --preset pg19" in out
    corpus = load_corpus("pg19", data_path=root, vocab_size=320)
    assert corpus.decode(corpus.splits["test"][:-1]) == (root / "test" / "1.txt").read_text()


def test_bad_path_is_a_message_not_a_traceback(tmp_path, capsys):
    assert cli.run(parse(["tokenizer", "--data-path", str(tmp_path / "nope")])) == 2
    assert capsys.readouterr().err.startswith("error: PG-19 root")
