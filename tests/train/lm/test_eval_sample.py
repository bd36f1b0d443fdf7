"""Evaluation (exact bits per byte, state carried across the split) and sampling (streamed,
reproducible)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.data.codec import decode_bytes
from transformer_vq.train import evaluate, evaluate_tokens, sample
from transformer_vq.train.lm.build import model_from_checkpoint
from transformer_vq.train.lm.sample import TextStream


@dataclass
class _Out:
    logits: torch.Tensor
    state: int


class UniformModel(torch.nn.Module):
    """Equal logits for all 256 bytes: the loss is ln 256 per token, i.e. exactly 8 bits per byte."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device

    def forward(self, input_ids, state=None):
        B, T = input_ids.shape
        return _Out(logits=torch.zeros(B, T, 256), state=(state or 0) + T)


def test_uniform_logits_give_exactly_8_bits_per_byte():
    tokens = np.random.default_rng(0).integers(0, 256, size=1001)
    result = evaluate_tokens(UniformModel(), tokens, window_len=7, streams=3)
    assert result.tokens == 1000
    assert f"{result.bits_per_byte:.3f}" == "8.000"
    # float32 log-softmax of equal logits is ln 256 to 1 ulp; the sum is accumulated in float64
    assert abs(result.bits_per_byte - 8.0) < 1e-6
    # bits per byte scales with tokens per byte (e.g. a tokenizer with 2 bytes per token)
    half = evaluate_tokens(UniformModel(), tokens, window_len=7, tokens_per_byte=0.5)
    assert abs(half.bits_per_byte - 4.0) < 1e-6


def test_state_is_carried_across_the_split(trained_run):
    """Evaluating in windows of any size equals one forward pass over the whole split."""
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokens = np.frombuffer(open(run_cfg.train.data_path, "rb").read()[:301], dtype=np.uint8).astype(np.int64)
    with torch.no_grad():
        x = torch.from_numpy(tokens)[None]  # (1, 301)
        logits = model(x[:, :-1]).logits
        whole = F.cross_entropy(logits[0], x[0, 1:]).item()
    for window in (5, 8, 64, 300):
        result = evaluate_tokens(model, tokens, window_len=window, streams=1)
        # float32: window splits change only the order of accumulation
        assert result.loss == pytest.approx(whole, rel=1e-5), window
    # and carrying the state matters: resetting it at every window would give another loss
    with torch.no_grad():
        chunks = [model(x[:, :-1][:, i:i + 8]).logits for i in range(0, 300, 8)]
    reset = F.cross_entropy(torch.cat(chunks, dim=1)[0], x[0, 1:]).item()
    assert abs(reset - whole) > 1e-3


@pytest.mark.parametrize("streams", [1, 2, 3, 5, 16])
def test_streams_begin_where_the_split_s_sequences_do_so_the_result_does_not_depend_on_them(trained_run, streams):
    """With the state reset every ``carry_tokens`` (a run's seq_len: one ImageNet64 image), the pieces read side by
    side are whole sequences: a stream that began inside one restarted its state and positions there (an image
    scored as two halves, and a loss that moved with ``--streams``). Here 7 sequences of 40 tokens and one of 19;
    each read alone from a fresh state gives the same total."""
    model, run_cfg, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokens = np.frombuffer(open(run_cfg.train.data_path, "rb").read()[:300], dtype=np.uint8).astype(np.int64)
    result = evaluate_tokens(model, tokens, window_len=8, streams=streams, carry_tokens=40)
    total = 0.0
    with torch.no_grad():
        for start in range(0, 299, 40):
            x = torch.from_numpy(tokens[start:start + 41])[None]
            total += F.cross_entropy(model(x[:, :-1]).logits[0], x[0, 1:], reduction="sum").item()
    assert result.tokens == 299 and result.loss == pytest.approx(total / 299, rel=1e-5)


def test_eval_cli_json_matches_the_library(trained_run, capsys):
    assert main(["eval", "--ckpt", str(trained_run), "--json", "--max-tokens", "500", "--streams", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    result = evaluate(str(trained_run), max_tokens=500, streams=1)
    assert printed["bits_per_byte"] == result.bits_per_byte and printed["tokens"] == 499
    assert set(printed) == {"ckpt", "split", "loss", "bits_per_byte", "tokens", "seconds", "tokens_per_s",
                            "word_perplexity", "objective", "carry_tokens"}
    assert printed["word_perplexity"] is None  # byte-level text counts no words
    assert main(["eval", "--ckpt", str(trained_run), "--split", "test", "--max-tokens", "300"]) == 0
    assert capsys.readouterr().out.startswith("test: loss ")


def test_same_seed_same_text(trained_run, capsys):
    args = ["sample", "--ckpt", str(trained_run), "--prompt", "the king", "--max-new-tokens", "60", "--top-p", "0.9"]
    outputs = []
    for seed in ("1", "1", "2"):
        assert main([*args, "--seed", seed]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]
    assert outputs[0].startswith("the king")
    library = "".join(sample(str(trained_run), "the king", max_new_tokens=60, top_p=0.9, seed=1))
    assert outputs[0] == "the king" + library + "\n"


@pytest.mark.parametrize("decode", [decode_bytes, lambda ids: bytes(ids).decode("utf-8", errors="replace")],
                         ids=["incremental", "whole"])
def test_text_stream_holds_back_incomplete_utf8(decode):
    stream = TextStream(decode)
    pieces = [stream.push(b) for b in "aé€".encode()]
    assert pieces == ["a", "", "é", "", "", "€"]
    stream = TextStream(decode)
    assert stream.push(0xE2) == "" and stream.flush() == "\ufffd"


def test_text_stream_of_bytes_decodes_incrementally_the_text_of_all_bytes():
    """Bytes are decoded as they come (a cost per token that does not grow with the text), into the text of every
    byte so far, as the stream that decodes everything again at each token gives: random bytes, valid or not."""
    rng = random.Random(0)
    alphabet = list("aé€😀".encode()) + [0xFF, 0xC0, 0x80, 0xED, 0xA0]
    for _ in range(2000):
        ids = [rng.choice(alphabet) if rng.random() < 0.8 else rng.randrange(256) for _ in range(rng.randrange(12))]
        streams = TextStream(decode_bytes), TextStream(lambda got: decode_bytes(got))
        texts = ["".join(stream.push(i) for i in ids) + stream.flush() for stream in streams]
        assert texts[0] == texts[1] == decode_bytes(ids), ids


def test_a_byte_model_reads_the_prompt_s_bytes_as_given_and_0_new_tokens_print_the_prompt(trained_run, capsys):
    """A command line's bytes that are not UTF-8 reach Python as the surrogates U+DC80..U+DCFF: a byte model reads
    them as the bytes they were (shown back as U+FFFD, as such bytes sampled are); a prompt no byte can spell (a
    lone surrogate from Python) is refused by name. ``--max-new-tokens 0`` prints the prompt, as generate returns it."""
    argv = ["sample", "--ckpt", str(trained_run), "--temperature", "0", "--prompt", "\udcff\udcfeab"]
    assert main([*argv, "--max-new-tokens", "0"]) == 0
    assert capsys.readouterr().out == "\ufffd\ufffdab\n"
    assert main([*argv, "--max-new-tokens", "6"]) == 0
    model = model_from_checkpoint(str(trained_run))[0]
    expected = model.generate(torch.tensor([[0xFF, 0xFE, 97, 98]]), 6, temperature=0)[0, 4:].tolist()
    assert capsys.readouterr().out == "\ufffd\ufffdab" + decode_bytes(expected) + "\n"
    with pytest.raises(ConfigError, match=r"prompt is not text \(surrogates not allowed at character 1: '\\ud800'\)"):
        sample(str(trained_run), "a\ud800", max_new_tokens=2)


@pytest.mark.parametrize("command", [["eval", "--max-tokens", "300"], ["sample", "--max-new-tokens", "5"]])
def test_threads_of_eval_and_sample_are_applied(trained_run, capsys, monkeypatch, command):
    """`--threads N` sets PyTorch's CPU threads for the job (left out: PyTorch's default is untouched), as `tvq train
    --threads` does: a shared CPU needs it for every job that computes, not for training alone."""
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    assert main([command[0], "--ckpt", str(trained_run), *command[1:], "--threads", "1"]) == 0
    assert main([command[0], "--ckpt", str(trained_run), *command[1:]]) == 0
    capsys.readouterr()
    assert asked == [1]


def test_eval_on_another_corpus_says_so_and_on_the_same_one_moved_does_not(trained_run, tmp_path, capsys):
    """`tvq eval --data-path` compares the corpus it reads with the checkpoint's record, by resume's comparison:
    another file (here the same length, other bytes) is scored, as lm-eval's documents are, with a note naming both
    (it gave a figure of another text in silence); the same file moved elsewhere scores as before, without one."""
    run_cfg = model_from_checkpoint(str(trained_run), device="cpu")[1]
    original = Path(run_cfg.train.data_path)
    moved = tmp_path / "moved" / "plays.txt"
    moved.parent.mkdir()
    moved.write_bytes(original.read_bytes())
    other = tmp_path / "other.txt"
    other.write_bytes(original.read_bytes().upper())
    assert main(["eval", "--ckpt", str(trained_run), "--json", "--max-tokens", "300", "--streams", "1",
                 "--data-path", str(moved)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["bits_per_byte"] == evaluate(
        str(trained_run), max_tokens=300, streams=1).bits_per_byte
    assert "note" not in out.err
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(trained_run), "--json", "--max-tokens", "300", "--data-path", str(other)]) == 0
    tokens = f"{original.stat().st_size * 9 // 10:,}"
    assert capsys.readouterr().err == (
        f"note: scoring on another corpus than the run's: --data-path holds the text corpus of {tokens} training "
        f"tokens read from {other}; the run in {trained_run} was trained on the text corpus of {tokens} training "
        f"tokens read from {original}\n")

