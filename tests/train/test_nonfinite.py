"""A non-finite loss skips the step, leaving weights, optimizer and codebooks unchanged; too many in a
row stop the run with a clear message."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from trainutil import read_metrics, tiny_config
from transformer_vq import TransformerVQ
from transformer_vq.train import TrainingError, train
from transformer_vq.train.checkpoint import read_checkpoint


class PoisonedModel(TransformerVQ):
    """TransformerVQ whose loss is NaN on chosen training calls (0-based), like a blow-up would be."""

    def __init__(self, cfg, poison_calls):
        super().__init__(cfg)
        self.poison_calls = set(poison_calls)
        self.calls = 0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if self.training:
            if self.calls in self.poison_calls:
                out.loss = out.loss * float("nan")
            self.calls += 1
        return out


def test_nonfinite_steps_are_skipped_then_stop(corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus_file, run_dir, "steps=20", "ckpt_every=4", "keep_ckpts=5", "max_nonfinite=3")
    model = PoisonedModel(cfg.model, poison_calls={2, 4, 5, 6})  # steps 3, 5, 6, 7 (1-based)
    with pytest.raises(TrainingError) as err:
        train(cfg, model=model)
    assert str(err.value) == (
        "stopped at step 7: 3 steps in a row had a non-finite loss or gradient (max_nonfinite=3); the weights are "
        "those of the last good step (saved). Lower the learning rate (--set lr=...), use precision=float32, "
        "or check the data"
    )
    skipped = [r["step"] for r in read_metrics(run_dir) if r["skipped"]]
    assert skipped == [3, 5, 6, 7]
    assert read_metrics(run_dir)[2]["loss"] is None  # NaN is written as null (JSON has no NaN)

    # steps 5-7 were skipped, so the state saved at the stop equals the one saved after step 4
    at4, at7 = read_checkpoint(run_dir / "checkpoints" / "step_00000004"), read_checkpoint(
        run_dir / "checkpoints" / "step_00000007")
    w4, w7 = (load_file(str(c.path / "model.safetensors")) for c in (at4, at7))
    assert any("codebook" in name or "ema" in name for name in w4), sorted(w4)  # codebooks are in there
    for name in w4:
        assert torch.equal(w4[name], w7[name]), name
    o4, o7 = at4.state["optimizer"]["state"], at7.state["optimizer"]["state"]
    assert o4.keys() == o7.keys()
    for index in o4:
        for key in o4[index]:
            assert torch.equal(o4[index][key], o7[index][key]), (index, key)


def test_one_skipped_step_changes_nothing(corpus_file, tmp_path):
    """A run with one poisoned step ends where a run that skipped nothing is after one step less
    (warmup is long, so the schedule is the same in both)."""
    poisoned_dir, clean_dir = tmp_path / "poisoned", tmp_path / "clean"
    cfg = tiny_config(corpus_file, poisoned_dir, "steps=4", "warmup_steps=100")
    model = PoisonedModel(cfg.model, poison_calls={3})  # the last step
    train(cfg, model=model)
    clean = TransformerVQ(cfg.model)
    train(tiny_config(corpus_file, clean_dir, "steps=3", "warmup_steps=100"), model=clean)
    for (name, a), (_, b) in zip(model.state_dict().items(), clean.state_dict().items()):
        assert torch.equal(a, b), name
