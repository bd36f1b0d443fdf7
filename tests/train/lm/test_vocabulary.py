"""A language model's vocabulary must be one its corpus can decode: a larger one trained to the end, then failed at
the end-of-run sample (and in every ``tvq sample`` and resume after), found by a new-user audit."""

from __future__ import annotations

import pytest

from trainutil import tiny_config
from transformer_vq.train import train


def test_a_vocabulary_larger_than_the_corpus_is_refused_before_training(corpus_file, tmp_path):
    with pytest.raises(ValueError, match=r"^--vocab-size: the model has 1000 token ids and the text corpus 256: the "
                                         r"ids above 255 could be sampled and never decoded; set --vocab-size 256$"):
        train(tiny_config(corpus_file, tmp_path / "run", "steps=1", "model.vocab_size=1000"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_encoder_may_have_a_larger_vocabulary(corpus_file, tmp_path):
    """An encoder never samples, so ids its corpus cannot decode are only unused rows (it was refused as if it
    could sample them)."""
    result = train(tiny_config(corpus_file, tmp_path / "run", "steps=1", "model.vocab_size=300", "model.causal=false",
                               "sample_tokens=0"))
    assert result.exit_code == 0
