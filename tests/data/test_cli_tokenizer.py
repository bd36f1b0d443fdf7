"""`tvq tokenizer`: trains and saves where `--data pg19` finds the model, and its `next:` line is a `tvq train` command
that works wherever the model was saved."""

import argparse
import shlex

import pytest

from transformer_vq.cli import SUBCOMMANDS, main
from transformer_vq.cli import tokenizer as cli
from transformer_vq.data import load_corpus
from transformer_vq.data.pg19 import default_tokenizer_path

# The tiny model over the `next:` command's --preset pg19, for a training step that takes a moment.
TINY = ["--d-model", "32", "--d-k", "16", "--d-v", "64", "--n-layers", "1", "--n-code", "8", "--block-len", "8",
        "--seq-len", "16", "--update-len", "16", "--batch-size", "1", "--steps", "1", "--threads", "1",
        "--eval-tokens", "16", "--sample-tokens", "0", "--log-every", "1000"]


def parse(argv):
    parser = argparse.ArgumentParser(prog="tvq")
    cli.add_parser(parser.add_subparsers()).set_defaults(_run=cli.run)
    return parser.parse_args(argv)


def make_tree(root):
    for split in ("train", "validation", "test"):
        (root / split).mkdir(parents=True)
        (root / split / "1.txt").write_text(f"The {split} book.\nIt has a few lines of text.\n" * 20)
    return root


def next_line(out: str) -> str:
    """The command of the last `next:` line of `tvq tokenizer`'s output."""
    return [line for line in out.splitlines() if line.startswith("next: ")][-1].removeprefix("next: ")


def train_as_told(command: str, run_dir) -> int:
    """Run the `next:` command, with the tiny model over its preset's sizes, for one step."""
    argv = shlex.split(command)
    assert argv[:2] == ["tvq", "train"]
    return main(argv[1:] + TINY + ["--run-dir", str(run_dir)])


def test_registered():
    assert SUBCOMMANDS["tokenizer"] == "transformer_vq.cli.tokenizer"


def test_trains_into_the_default_location(tmp_path, capsys):
    root = make_tree(tmp_path / "pg19")
    assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", "320", "--threads", "1"])) == 0
    out = capsys.readouterr().out
    # not the preset's 32,000 pieces: the size picks the tokenizer and sizes the model
    assert "BPE tokenizer" in out and next_line(out) == (f"tvq train --data pg19 --data-path {root} --data-option "
                                                         f"vocab_size=320 --preset pg19 --vocab-size 320")
    corpus = load_corpus("pg19", data_path=root, vocab_size=320)
    assert corpus.decode(corpus.splits["test"][:-1]) == (root / "test" / "1.txt").read_text()


def test_the_paper_size_needs_the_preset_alone(tmp_path):
    """At 32,000 pieces (the preset's), the `next:` line is the plain paper command (training a tokenizer that large
    takes a real corpus: the trained tokenizer is stood in for)."""
    root = make_tree(tmp_path / "pg19")
    path = default_tokenizer_path(root, 32000)
    path.write_bytes(b"")  # find_tokenizer finds the file; nothing reads it
    tokenizer = argparse.Namespace(vocab_size=32000, path=path)
    cfg = argparse.Namespace(data_path=str(root))
    assert cli.train_command(cfg, tokenizer) == f"tvq train --data pg19 --data-path {root} --preset pg19"


@pytest.mark.parametrize("where", ["out", "cache-dir"])
def test_a_tokenizer_saved_elsewhere_is_named_by_its_path(tmp_path, capsys, where):
    """`tvq train` reads only $TVQ_CACHE_DIR: a model written by --out or to another --cache-dir is passed to it with
    --data-option tokenizer=PATH, and the command trains (it said to omit --out, or named a cache it does not read)."""
    root = make_tree(tmp_path / "pg19")
    flag = ["--out", str(tmp_path / "tok.model")] if where == "out" else ["--cache-dir", str(tmp_path / "other")]
    assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", "320", "--threads", "1", *flag])) == 0
    out = capsys.readouterr().out
    saved = out.split("saved ", 1)[1].split(" (sha256")[0]
    command = next_line(out)
    assert command == (f"tvq train --data pg19 --data-path {root} --data-option tokenizer={saved} --preset pg19 "
                       f"--vocab-size 320")
    assert train_as_told(command, tmp_path / "run") == 0
    assert "done: 1 steps" in capsys.readouterr().out


def test_the_next_line_of_the_default_location_trains(tmp_path, capsys):
    root = make_tree(tmp_path / "pg19")
    for size in ("320", "310"):  # two sizes in the cache: the command picks its own
        assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", size, "--threads", "1"])) == 0
    assert train_as_told(next_line(capsys.readouterr().out), tmp_path / "run") == 0


def test_an_existing_out_is_refused_before_training(tmp_path, capsys):
    root = make_tree(tmp_path / "pg19")
    model = tmp_path / "tok.model"
    model.write_bytes(b"a tokenizer of another run")
    argv = ["tokenizer", "--data-path", str(root), "--vocab-size", "320", "--threads", "1", "--out", str(model)]
    assert cli.run(parse(argv)) == 2
    assert capsys.readouterr().err == (f"error: --out: {model} exists already; pass a new path, or remove it first "
                                       f"(nothing is overwritten)\n")
    assert model.read_bytes() == b"a tokenizer of another run"
    assert cli.run(parse(argv[:-1] + [str(tmp_path)])) == 2
    assert capsys.readouterr().err == (f"error: --out: {tmp_path} is a directory; pass the path of the .model file "
                                       f"to write\n")


def test_a_size_the_text_cannot_reach_is_refused(tmp_path, capsys):
    """Not a smaller tokenizer in silence (saved under the size asked, where `vocab_size=N` finds it)."""
    root = make_tree(tmp_path / "pg19")
    assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", "5000", "--threads", "1"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --vocab-size 5000 is more than the training text supports: SentencePiece can form "
                          "at most ") and "pieces from its 41 lines; pass --vocab-size " in err, err
    reached = int(err.split("at most ")[1].split()[0])
    assert 300 < reached < 5000 and err.endswith(f"--vocab-size {reached} or less, or train on more text (nothing was "
                                                 f"saved)\n")
    assert not list((tmp_path / "cache" / "pg19").glob("*.model"))
    # the most it names is what it trains
    assert cli.run(parse(["tokenizer", "--data-path", str(root), "--vocab-size", str(reached), "--threads", "1"])) == 0
    assert f"trained a {reached}-piece BPE tokenizer" in capsys.readouterr().out


def test_bad_path_is_a_message_not_a_traceback(tmp_path, capsys):
    assert cli.run(parse(["tokenizer", "--data-path", str(tmp_path / "nope")])) == 2
    assert capsys.readouterr().err.startswith("error: PG-19 root")
