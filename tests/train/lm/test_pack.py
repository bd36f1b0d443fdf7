"""`tvq train --pack`: documents of a corpus packed into sequences, none attending to or predicted from another."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from trainutil import tiny_config, write_corpus
from transformer_vq import TransformerVQ
from transformer_vq.config import ConfigError
from transformer_vq.data.batches import TokenBatches, packed_documents
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.train import train


class Recorder(TransformerVQ):
    """Records what every training window is called with."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = []

    def forward(self, input_ids, state=None, **kwargs):
        if self.training:
            self.calls.append((input_ids.clone(), kwargs.get("position_ids"), kwargs.get("loss_mask")))
        return super().forward(input_ids, state, **kwargs)


def test_positions_restart_at_every_document():
    tokens = np.arange(40)
    batches = TokenBatches(tokens, batch_size=3, seq_len=9, documents=np.array([4, 11, 12, 30]))
    batch, positions = batches.next_batch()
    for row, ids in zip(positions, batch):  # the token id is its offset in the split here
        first = np.array([max([0] + [d for d in (4, 11, 12, 30) if d <= int(i)]) for i in ids])
        assert row.tolist() == (ids.numpy() - first).tolist()
    assert TokenBatches(tokens, batch_size=3, seq_len=9).next_batch()[1] is None


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
    """A text directory of 24 short documents (one per file, ~40 to ~300 bytes)."""
    root = tmp_path_factory.mktemp("plays")
    for i in range(24):
        write_corpus(root / f"play{i:02d}.txt", n_lines=2 + i % 12)
    return root


def test_training_windows_carry_positions_and_mask_the_first_token_of_each_document(plays, tmp_path):
    cfg = tiny_config(plays, tmp_path / "run", "steps=6", "pack=true")
    model = Recorder(cfg.model)
    result = train(cfg, model=model)
    assert result.step == 6
    starts_seen = 0
    for window, (ids, positions, loss_mask) in enumerate(model.calls):
        assert positions is not None and positions.shape == ids.shape
        next_positions = torch.cat([positions[:, 1:], positions[:, -1:] + 1], dim=1)
        # the last column's target position is the first of the next window: checked through the loss mask's shape
        assert loss_mask.shape == ids.shape
        inner = loss_mask[:, :-1] == (next_positions[:, :-1] != 0)
        assert bool(inner.all())
        starts_seen += int((positions == 0).sum())
    assert starts_seen > 0  # some window holds a document boundary


def test_a_text_lines_file_packs_one_document_per_line(corpus_file, tmp_path):
    cfg = tiny_config(corpus_file, tmp_path / "run", "steps=2", "pack=true")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data_options={"lines": True}))
    model = Recorder(cfg.model)
    train(cfg, model=model)
    text = corpus_file.read_bytes()
    for ids, positions, _ in model.calls:
        for row_ids, row_positions in zip(ids.tolist(), positions.tolist()):
            for i in range(1, len(row_ids)):  # a document starts exactly after a newline
                assert (row_positions[i] == 0) == (row_ids[i - 1] == ord("\n")), (i, row_ids, row_positions)
    assert text.count(b"\n") > 100


def test_lines_without_pack_is_refused_not_ignored(corpus_file, tmp_path):
    """One document per line changes nothing but packing: without --pack the run was the same, the option ignored in
    silence (helper-72 audit-cli F6)."""
    cfg = tiny_config(corpus_file, tmp_path / "run", "steps=2")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data_options={"lines": True}))
    with pytest.raises(DataError, match=r"^--data-option lines: .* applies only with --pack: add --pack or leave it"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_pack_refuses_a_corpus_without_documents_and_models_that_cannot(corpus_file, tmp_path):
    corpus = Corpus(name="enwik8", splits={"train": np.zeros(8, dtype=np.uint8)}, vocab_size=256)
    with pytest.raises(DataError, match="^--pack needs a corpus whose documents are known, and 'enwik8' records none "
                                        "for its train split; use --data shakespeare or pg19, --data text with a "
                                        r"directory of several files \(one document each\) or a file read with "
                                        r"--data-option lines=true \(one per line\), or leave --pack off$"):
        packed_documents(corpus, "train")
    # documents that the contiguous cut into splits left the train split one of: the message says so
    cut = Corpus(name="text", splits={"train": np.zeros(8, dtype=np.uint8)}, vocab_size=256,
                 documents={"train": np.array([0]), "validation": np.array([0, 3]), "test": np.array([0])})
    with pytest.raises(DataError, match=r"^--pack needs two documents or more in the train split, and 'text' begins "
                                        r"one document only there: the corpus is cut into splits by position"):
        packed_documents(cut, "train")
    # a single text file is one document: packing it would change nothing, and said nothing
    with pytest.raises(DataError, match="^--pack needs a corpus whose documents are known, and 'text' records one "
                                        "document only for its train split"):
        train(tiny_config(corpus_file, tmp_path / "one", "steps=1", "pack=true"))
    with pytest.raises(ConfigError, match=r"^invalid RunConfig: pack packs documents for next-token training; "
                                          r"tvq train's masked-token objective of an encoder \(causal=False\) takes "
                                          r"whole rows: leave --pack off, or train a causal model"):
        tiny_config(corpus_file, tmp_path / "r", "pack=true", "model.causal=false")
    with pytest.raises(ConfigError, match=r"^invalid RunConfig: pack does not combine with context_parallel=2 .*: "
                                          r"use one of them$"):
        tiny_config(corpus_file, tmp_path / "r", "pack=true", "context_parallel=2")


@pytest.mark.parametrize("first, then", [("true", "false"), ("false", "true")])
def test_a_resume_keeps_the_runs_packing(plays, tmp_path, first, then):
    """Packing decides what each token attends to and is predicted from, and a checkpoint inside a batch carries its
    rows' positions in their documents: a resume that turns it on or off is refused before anything is written (it
    used to be accepted, and the run went on reading its data another way without a word)."""
    run_dir = tmp_path / "run"
    assert train(tiny_config(plays, run_dir, "steps=1", f"pack={first}")).exit_code == 0
    config = (run_dir / "config.json").read_text()
    keep = "--pack" if first == "true" else "--no-pack"
    with pytest.raises(ConfigError, match=rf"^--pack: the run in .* was trained with pack {first.title()} and this "
                                          rf"run asks for {then.title()}; it decides which tokens .* "
                                          rf"\(or give {keep}\)"):
        train(tiny_config(plays, run_dir, "steps=2", f"pack={then}"), resume="auto")
    assert (run_dir / "config.json").read_text() == config


def test_a_packed_run_resumed_on_its_tokens_cut_into_other_documents_is_refused(plays, tmp_path):
    """The corpus fingerprint holds the document starts: the same bytes in other files pack into other sequences,
    which a packed run refuses to continue (it resumed without a word); an unpacked run reads only the tokens."""
    text = b"".join(path.read_bytes() for path in sorted(plays.iterdir()))
    merged = tmp_path / "merged"
    merged.mkdir()
    half = len(text) // 2
    (merged / "a.txt").write_bytes(text[:half])
    (merged / "b.txt").write_bytes(text[half:])
    for pack in ("true", "false"):
        run_dir = tmp_path / f"run-{pack}"
        assert train(tiny_config(plays, run_dir, "steps=1", f"pack={pack}")).exit_code == 0
        resumed = tiny_config(merged, run_dir, "steps=2", f"pack={pack}")
        if pack == "true":
            with pytest.raises(ConfigError, match=r"^--data-path: the run in .* packs documents \(--pack\), and this "
                                                  r"run reads its corpus cut into other documents"):
                train(resumed, resume="auto")
        else:
            assert train(resumed, resume="auto").exit_code == 0


def test_a_changed_data_option_of_a_packed_run_is_refused_as_data_not_as_packing(corpus_file, tmp_path):
    """A kept field is refused from the checkpoint's config before the corpus is read: a packed run of a lines file
    resumed with ``lines=false`` got the --pack corpus error, advising the very option the run had."""
    def config(steps, lines):
        cfg = tiny_config(corpus_file, tmp_path / "run", f"steps={steps}", "pack=true")
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data_options={"lines": lines}))

    assert train(config(1, True)).exit_code == 0
    with pytest.raises(ConfigError, match=r"^--data-option: the run in .* was trained with data_options "):
        train(config(2, False), resume="auto")
