"""The training loop's structure: windows, state reset per batch, bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from trainutil import read_metrics, tiny_config
from transformer_vq import TransformerVQ
from transformer_vq.train import train


class Recorder(TransformerVQ):
    """Records the offset of the state each training window starts from."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.offsets, self.dtypes = [], []

    def forward(self, input_ids, state=None, **kwargs):
        out = super().forward(input_ids, state, **kwargs)
        if self.training:
            self.offsets.append(0 if state is None else state.offset)
            self.dtypes.append(out.logits.dtype)
            assert state is None or not any(t.requires_grad for layer in state.layers
                                            for t in vars(layer).values() if isinstance(t, torch.Tensor))
        return out


def test_windows_carry_state_within_a_batch_and_reset_between(corpus_file, tmp_path):
    # seq_len 48 = 3 windows of 16: one optimizer step per window, the state carried (detached) to
    # the next window of the same sequences and reset at every new batch
    cfg = tiny_config(corpus_file, tmp_path / "run", "steps=7", "seq_len=48")
    model = Recorder(cfg.model)
    result = train(cfg, model=model)
    assert result.step == 7 and len(read_metrics(tmp_path / "run")) == 7
    assert model.offsets == [0, 16, 32, 0, 16, 32, 0]


def test_bfloat16_autocast_keeps_float32_parameters(corpus_file, tmp_path):
    cfg = tiny_config(corpus_file, tmp_path / "run", "steps=4", "precision=bfloat16")
    model = Recorder(cfg.model)
    train(cfg, model=model)
    assert set(model.dtypes) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    losses = [r["loss"] for r in read_metrics(tmp_path / "run")]
    assert all(loss is not None for loss in losses)


def test_metrics_jsonl_and_tensorboard(trained_run):
    records = read_metrics(trained_run)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert set(records[0]) == {"step", "loss", "ce_loss", "commit_loss", "bits_per_byte", "lr", "grad_norm", "tokens",
                               "seconds", "tokens_per_s", "compiled", "skipped", "codebook_perplexity",
                               "codebook_unused"}
    assert not any(r["compiled"] for r in records)  # no --torch-compile: every step counts in the rate
    assert all(r["loss"] == pytest.approx(r["ce_loss"] + 1e-4 * r["commit_loss"]) for r in records)
    events = list((trained_run / "tb").glob("events.out.tfevents.*"))
    assert events and b"train/loss" in events[0].read_bytes() and b"validation/bits_per_byte" in events[0].read_bytes()
