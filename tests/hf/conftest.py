"""Fixtures of the Hugging Face tests: a tiny library model (several blocks of context in a few dozen tokens) and
one tiny run trained by `tvq train` for the export tests. Nothing here imports transformers: each test module skips
itself when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from transformer_vq.cli import main

LINE = "the king shall speak to thee of love and war, my lord; good night.\n"


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise comparisons between two code paths want one reduction order
    yield
    torch.set_num_threads(previous)


def tiny_model(**overrides) -> TransformerVQ:
    """The tiny preset (block_len 8) with trained-looking, non-zero position parameters, in eval mode."""
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", vocab_size=64, **overrides)).eval()
    with torch.no_grad():
        for unit in model.units:
            unit.u.normal_(std=0.5)
            unit.v_r.normal_(std=0.5)
    return model


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A run directory written by `tvq train` (tiny preset, two steps)."""
    root = tmp_path_factory.mktemp("run")
    corpus = root / "plays.txt"
    corpus.write_text(LINE * 500)
    run_dir = root / "run"
    code = main(["train", "--preset", "tiny", "--data", "text", "--data-path", str(corpus), "--run-dir",
                 str(run_dir), "--seq-len", "32", "--update-len", "16", "--batch-size", "4", "--steps", "2",
                 "--sample-tokens", "0", "--eval-tokens", "0", "--log-every", "1000"])
    assert code == 0
    return run_dir
