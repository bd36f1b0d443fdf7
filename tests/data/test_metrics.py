"""Bits per byte and word-level perplexity on hand-computable cases."""

import math

import numpy as np
import pytest
import torch

from transformer_vq.data.corpus import Corpus
from transformer_vq.data.metrics import (bits_per_byte, corpus_tokens_per_byte, corpus_tokens_per_word, count_words,
                                         word_perplexity)


def test_uniform_logits_over_256_bytes_are_exactly_8_bpb():
    targets = torch.randint(0, 256, (4, 1000), generator=torch.Generator().manual_seed(0))
    logits = torch.zeros(4, 1000, 256, dtype=torch.float64)
    mean_nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)).item()
    assert bits_per_byte(mean_nll) == pytest.approx(8.0, abs=1e-12)
    assert f"{bits_per_byte(mean_nll):.3f}" == "8.000"
    assert bits_per_byte(math.log(256)) == 8.0


def test_tokenized_text_is_measured_over_original_bytes():
    # 10 tokens, each with probability 1/2, covering 40 original bytes: 10 bits / 40 bytes
    assert bits_per_byte(math.log(2)) == pytest.approx(1.0)  # bits per token
    assert bits_per_byte(math.log(2), tokens_per_byte=10 / 40) == pytest.approx(0.25)


def test_word_level_perplexity_as_in_rae_et_al():
    # 6 tokens each with probability 1/4 over a 3-word text: exp(6 ln 4 / 3) = 16
    text = "the  cat\nsat"
    assert count_words(text) == 3
    assert word_perplexity(math.log(4), 6 / count_words(text)) == pytest.approx(16.0)
    # one word predicted with probability 1/e per word: perplexity e
    assert word_perplexity(1.0, 1.0) == pytest.approx(math.e)
    # an untrained model over a large vocabulary: inf, not an OverflowError
    assert word_perplexity(12.0, 100.0) == math.inf


def test_corpus_ratios_count_original_bytes_and_words():
    tokens = np.arange(30) % 7
    corpus = Corpus(name="t", splits={"validation": tokens}, vocab_size=7, split_bytes={"validation": 120},
                    metadata={"split_words": {"validation": 10}})
    assert corpus_tokens_per_byte(corpus, "validation") == 0.25
    assert corpus_tokens_per_word(corpus, "validation") == 3.0
    plain = Corpus(name="b", splits={"validation": tokens}, vocab_size=256)
    assert corpus_tokens_per_byte(plain, "validation") == 1.0 and corpus_tokens_per_word(plain, "validation") is None


def test_count_words_on_bytes_matches_str_split_for_ascii():
    text = "  Leading\tand trailing \r\n\n words\x0bvertical\x1cfile-sep  end  "
    raw = text.encode()
    assert count_words(raw) == count_words(np.frombuffer(raw, dtype=np.uint8)) == len(text.split()) == 7
    assert count_words(b"") == 0 and count_words("") == 0 and count_words(b"   ") == 0
    # chunk boundaries do not split or merge words
    big = (b"ab " * 9_000_000)[:-1]
    assert count_words(np.frombuffer(big, dtype=np.uint8)) == 9_000_000
