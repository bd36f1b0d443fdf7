"""The paper's datasets through training, evaluation and sampling: word-level perplexity on PG-19,
the tokenizer saved with the run, loader options from the command line, PNG samples of image models."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from trainutil import TINY
from transformer_vq.config import ConfigError, parse_data_options
from transformer_vq.cli import main
from transformer_vq.data import load_corpus
from transformer_vq.data.metrics import count_words
from transformer_vq.data.pg19 import train_pg19_tokenizer
from transformer_vq.train import evaluate_tokens, load_config
from transformer_vq.train.lm.build import build_model
from transformer_vq.train.checkpoint import save_checkpoint
from transformer_vq.train.lm.evaluate import corpus_tokens_per_byte, corpus_tokens_per_word
from transformer_vq.train.lm.sample import sample_image_tokens

BOOK = "It was the best of times,  it was the worst of times;\nthe coach rolled on\tand Mr. Lorry said: “Recalled.”\n\n"
TRAIN = {f"{100 + i}.txt": BOOK * (20 + i) for i in range(3)}
VALIDATION = {"200.txt": "A short book — naïve café, with   spaces.\n", "201.txt": BOOK * 2}
TEST = {"300.txt": "  the end  \n"}


@pytest.fixture
def pg19_tree(tmp_path):
    root = tmp_path / "pg19"
    for split, books in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST)):
        (root / split).mkdir(parents=True)
        for name, text in books.items():
            (root / split / name).write_bytes(text.encode("utf-8"))
    return root


@pytest.fixture
def pg19_tokenizer(pg19_tree, tmp_path):
    """The path of a 300-piece tokenizer trained on the tree, saved outside the cache."""
    path = tmp_path / "elsewhere" / "pg19-300.model"
    train_pg19_tokenizer(pg19_tree, path, vocab_size=300, num_threads=1)
    return path


@dataclass
class _Out:
    logits: torch.Tensor
    state: int


class UniformModel(torch.nn.Module):
    """Equal logits over ``vocab`` tokens: every token costs ln V nats."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, state=None):
        B, T = input_ids.shape
        return _Out(logits=torch.zeros(B, T, self.vocab), state=(state or 0) + T)


def test_word_perplexity_of_uniform_logits_is_v_to_the_tokens_per_word(pg19_tree, pg19_tokenizer):
    corpus = load_corpus("pg19", data_path=pg19_tree, tokenizer=pg19_tokenizer)
    tokens = corpus.split("validation")
    V = corpus.vocab_size
    text = "".join(VALIDATION.values())
    words, n_bytes = len(text.split()), len(text.encode("utf-8"))
    assert corpus.metadata["split_words"]["validation"] == words == count_words(text)
    assert corpus.split_bytes["validation"] == n_bytes  # original bytes, not tokens
    result = evaluate_tokens(UniformModel(V), tokens, window_len=8, streams=2,
                             tokens_per_byte=corpus_tokens_per_byte(corpus, "validation"),
                             tokens_per_word=corpus_tokens_per_word(corpus, "validation"))
    assert result.word_perplexity == pytest.approx(V ** (len(tokens) / words), rel=1e-6)
    assert result.bits_per_byte == pytest.approx(math.log2(V) * len(tokens) / n_bytes, rel=1e-6)
    # byte-level corpora count no words: no word-level perplexity
    assert evaluate_tokens(UniformModel(256), np.arange(100) % 256, window_len=8).word_perplexity is None


def _train_pg19(tree, tokenizer, run_dir, *extra):
    args = ["train", "--preset", "tiny", "--data", "pg19", "--data-path", str(tree), "--run-dir", str(run_dir),
            "--data-option", f"tokenizer={tokenizer}", "--steps", "2", *[f"--set={o}" for o in TINY], *extra]
    assert main(args) == 0


def test_pg19_run_keeps_its_tokenizer_and_reports_word_perplexity(pg19_tree, pg19_tokenizer, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _train_pg19(pg19_tree, pg19_tokenizer, run_dir, "--set", "model.vocab_size=300")
    copy = run_dir / "tokenizer.model"
    assert copy.read_bytes() == pg19_tokenizer.read_bytes()
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["train"]["data_options"] == {"tokenizer": str(pg19_tokenizer)}
    assert re.search(r"validation [\d.]+ bits per byte, word-level perplexity [\d.]+\.", capsys.readouterr().out)
    # the original tokenizer is gone: eval and sample work from the run's copy
    pg19_tokenizer.unlink()
    assert main(["eval", "--ckpt", str(run_dir), "--json", "--streams", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["word_perplexity"] is not None and math.isfinite(printed["word_perplexity"])
    words = len("".join(VALIDATION.values()).split())
    corpus = load_corpus("pg19", data_path=pg19_tree, tokenizer=copy)
    n_tokens = len(corpus.split("validation"))
    assert printed["word_perplexity"] == pytest.approx(math.exp(printed["loss"] * n_tokens / words), rel=1e-9)
    assert main(["eval", "--ckpt", str(run_dir), "--max-tokens", "50"]) == 0
    assert "word-level perplexity" in capsys.readouterr().out
    assert main(["sample", "--ckpt", str(run_dir), "--prompt", "It was", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("It was")


def test_unknown_data_option_is_a_message_not_a_traceback(pg19_tree, pg19_tokenizer, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--data", "pg19", "--data-path", str(pg19_tree), "--run-dir",
                 str(tmp_path / "bad"), "--data-option", "vocab=300", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dataset 'pg19' has no option 'vocab'; its options are: tokenizer, vocab_size")
    assert "Traceback" not in err
    assert main(["train", "--data-option", "no-equals-sign", "--steps", "1"]) == 2
    assert "must look like KEY=VALUE" in capsys.readouterr().err
    # eval: on top of the options saved with the run
    run_dir = tmp_path / "run"
    _train_pg19(pg19_tree, pg19_tokenizer, run_dir, "--set", "model.vocab_size=300")
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(run_dir), "--data-option", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "has no option 'bogus'" in err and "Traceback" not in err
    # another tokenizer scored the model in silence (helper-72 audit-cli F5: 8.5 bits per byte for 5.1): refused;
    # the run's own tokenizer, named from anywhere, is accepted
    other_tree, other = tmp_path / "reversed", tmp_path / "other.model"
    for book in pg19_tree.rglob("*.txt"):  # the same books written backwards: another tokenizer of 300 pieces
        (other_tree / book.relative_to(pg19_tree)).parent.mkdir(parents=True, exist_ok=True)
        (other_tree / book.relative_to(pg19_tree)).write_text(book.read_text()[::-1])
    train_pg19_tokenizer(other_tree, other, vocab_size=300, num_threads=1)
    assert other.read_bytes() != pg19_tokenizer.read_bytes()
    assert main(["eval", "--ckpt", str(run_dir), "--data-option", f"tokenizer={other}", "--max-tokens", "20"]) == 2
    assert capsys.readouterr().err == (f"error: --data-option tokenizer={other} is not the tokenizer this run was "
                                       f"trained with ({run_dir / 'tokenizer.model'}): the model's tokens would be "
                                       f"read as another tokenizer's; leave the option out\n")
    assert main(["eval", "--ckpt", str(run_dir), "--data-option", f"tokenizer={pg19_tokenizer}",
                 "--max-tokens", "20"]) == 0
    # an empty file as the tokenizer: once "RuntimeError: INTERNAL: Model is not initialized" (audit-cli F4)
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    assert main(["train", "--preset", "tiny", "--data", "pg19", "--data-path", str(pg19_tree), "--run-dir",
                 str(tmp_path / "empty-run"), "--data-option", f"tokenizer={empty}", "--steps", "1"]) == 2
    assert f"error: {empty} holds no SentencePiece model (it is empty)" in capsys.readouterr().err


def test_data_options_are_typed_and_saved(tmp_path):
    options = parse_data_options(["tokenizer=a/b.model", "validation_every=4", "expected_images=null",
                                  "fractions=[0.8, 0.1, 0.1]", "flag=true", "date=2020-01-01"])
    assert options == {"tokenizer": "a/b.model", "validation_every": 4, "expected_images": None,
                       "fractions": [0.8, 0.1, 0.1], "flag": True, "date": "2020-01-01"}
    with pytest.raises(ConfigError, match="must look like KEY=VALUE"):
        parse_data_options(["=3"])
    with pytest.raises(ConfigError, match="data_options must be a mapping"):
        load_config("tiny", overrides=["train.data_options=tokenizer=x"])


# --- image models -----------------------------------------------------------------------------------


def _image_run(run_dir):
    """A checkpoint of a tiny untrained byte model whose saved config says it was trained on imagenet64."""
    cfg = load_config("tiny", overrides=["data=imagenet64", "model.abs_pos=true", f"run_dir={run_dir}"])
    torch.manual_seed(0)
    model = build_model(cfg)
    save_checkpoint(run_dir / "checkpoints", step=1, model=model, config=cfg.to_dict(), state={}, keep=1)
    return model


def _fast_stream(self, input_ids, max_new_tokens, *, temperature=1.0, top_k=None, top_p=1.0, generator=None):
    """Uniformly random tokens: a real model samples 12,287 tokens per image one at a time (minutes
    on a CPU); the image path is the same whatever the tokens are."""
    for _ in range(max_new_tokens):
        yield torch.randint(0, 256, (input_ids.shape[0],), generator=generator)


def test_sample_writes_png_images_and_a_grid(tmp_path, monkeypatch, capsys):
    from PIL import Image

    from transformer_vq import TransformerVQ

    _image_run(tmp_path / "img")
    monkeypatch.setattr(TransformerVQ, "stream", _fast_stream)
    out = tmp_path / "pngs"
    assert main(["sample", "--ckpt", str(tmp_path / "img"), "--out", str(out), "--num-samples", "3"]) == 0
    assert "wrote 3 images and a grid" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["grid.png", "sample_000.png", "sample_001.png", "sample_002.png"]
    for i in range(3):
        with Image.open(out / f"sample_{i:03d}.png") as image:
            assert (image.format, image.mode, image.size) == ("PNG", "RGB", (64, 64))
            assert np.asarray(image).shape == (64, 64, 3)
    with Image.open(out / "grid.png") as grid:
        assert grid.size == (2 * 66 + 2, 2 * 66 + 2)  # 2 x 2 cells of 64 px + 2 px padding
    # default directory: RUN_DIR/samples
    assert main(["sample", "--ckpt", str(tmp_path / "img"), "--num-samples", "1"]) == 0
    assert (tmp_path / "img" / "samples" / "sample_000.png").is_file()


def test_image_tokens_are_whole_images_and_reproducible(tmp_path, monkeypatch):
    from transformer_vq import TransformerVQ

    model = _image_run(tmp_path / "img")
    monkeypatch.setattr(TransformerVQ, "stream", _fast_stream)
    images = sample_image_tokens(model, 2, seed=3)
    assert images.shape == (2, 12288) and images.dtype == torch.long
    assert 0 <= int(images.min()) and int(images.max()) <= 255
    assert torch.equal(images, sample_image_tokens(model, 2, seed=3))
    assert not torch.equal(images, sample_image_tokens(model, 2, seed=4))


def test_an_image_run_ends_with_no_text_sample_and_refuses_one(monkeypatch):
    """A few hundred subpixels are neither an image nor text: the end of training samples none (tvq sample writes
    an image model's PNG files), and the options of that text sample are refused for an image corpus by name."""
    from types import SimpleNamespace

    from transformer_vq.train.lm import trainer

    cfg = load_config("tiny", overrides=["data=imagenet64", "model.abs_pos=true"])
    monkeypatch.setattr(trainer, "stream_text", lambda *a, **k: pytest.fail("an image run sampled text"))
    run = SimpleNamespace(cfg=cfg, tc=cfg.train, sample=None)
    trainer.LMTrainer.finish(run)
    assert run.sample is None and cfg.train.sample_tokens == 300  # the default, asking for nothing here
    for flag in (["sample_tokens=50"], ["sample_prompt=ROMEO:"]):
        with pytest.raises(ConfigError, match=r"applies only with causal true (and sample_tokens above 0 )?and data "
                                              r"other than 'imagenet64' \(this run has data 'imagenet64'\)"):
            load_config("tiny", overrides=["data=imagenet64", "model.abs_pos=true", *flag])
    assert load_config("tiny", overrides=["data=imagenet64", "model.abs_pos=true", "sample_tokens=0"])


def test_text_model_is_not_sampled_as_images(trained_run, tmp_path):
    from transformer_vq.train.lm.sample import sample_images

    with pytest.raises(ValueError, match="is not an image model"):
        sample_images(str(trained_run))
    with pytest.raises(ValueError, match="out applies only with data 'imagenet64' \\(this run has data 'text'\\)"):
        sample_images(str(trained_run), tmp_path / "x")


def test_resume_reuses_saved_data_options(tmp_path):
    from transformer_vq.cli import build_parser
    from transformer_vq.cli.train import build_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = load_config("tiny", overrides=[f"run_dir={run_dir}", "data=text"])
    saved = dataclasses.replace(saved, train=dataclasses.replace(saved.train, data_options={"glob": "*.txt"}))
    (run_dir / "config.json").write_text(saved.to_json())
    args = build_parser().parse_args(["train", "--resume", "--run-dir", str(run_dir)])
    assert build_config(args).train.data_options == {"glob": "*.txt"}
    args = build_parser().parse_args(["train", "--resume", "--run-dir", str(run_dir),
                                      "--data-option", "fractions=[0.8, 0.1, 0.1]"])
    assert build_config(args).train.data_options == {"glob": "*.txt", "fractions": [0.8, 0.1, 0.1]}
