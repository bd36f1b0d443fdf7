"""A non-finite loss skips the step, leaving weights, optimizer and codebooks unchanged; too many in a
row stop the run with a clear message."""

from __future__ import annotations

import math

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


def test_infinite_learning_rate_skips_steps_and_saves_only_finite_weights(corpus_file, tmp_path):
    """``lr=inf`` once trained a step whose loss and gradient were finite, turning every weight into NaN, and
    saved that checkpoint. A non-finite learning rate now skips the step like a non-finite loss does."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus_file, run_dir, "steps=8", "ckpt_every=2", "max_nonfinite=3")
    # the flags refuse inf; the loop must hold even when a non-finite rate reaches it
    object.__setattr__(cfg.train, "lr", math.inf)
    with pytest.raises(TrainingError) as err:
        train(cfg)
    assert str(err.value) == (
        "stopped at step 3: 3 steps in a row had a non-finite learning rate (lr=inf) (max_nonfinite=3); the weights "
        "are those of the last good step (saved). Lower the learning rate (--set lr=...), use precision=float32, "
        "or check the data"
    )
    assert [r["skipped"] for r in read_metrics(run_dir)] == [True, True, True]
    saved = load_file(str(read_checkpoint(run_dir / "checkpoints" / "step_00000003").path / "model.safetensors"))
    torch.manual_seed(cfg.train.seed)
    initial = TransformerVQ(cfg.model).state_dict()
    assert saved.keys() == initial.keys()
    for name, value in saved.items():
        assert torch.equal(value, initial[name]), name  # untouched initial weights, resumable


def test_step_that_makes_weights_non_finite_stops_without_saving(corpus_file, tmp_path, monkeypatch):
    """A finite loss, gradient and learning rate can still overflow the weights (a huge finite rate):
    training stops at that step, and nothing from it is saved."""
    run_dir = tmp_path / "run"
    original_step = torch.optim.AdamW.step
    calls = []

    def overflowing_step(self, *args, **kwargs):
        result = original_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(math.inf)
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing_step)
    with pytest.raises(TrainingError) as err:
        train(tiny_config(corpus_file, run_dir, "steps=8", "ckpt_every=2"))
    assert str(err.value) == (
        "step 3 made the weights non-finite (embed.weight) although its loss and gradient were finite: the "
        "learning rate 0.0018 is too large. Nothing after the last checkpoint was saved; lower the learning rate "
        "and start again or resume with --resume auto"
    )
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")] == ["step_00000002"]


def test_a_window_that_poisons_the_carried_state_skips_one_step_not_the_batch(corpus_file, tmp_path, capsys):
    """NaN activations in one window leave its carried state NaN; carried on, every later window of the batch read it
    and was skipped (and a checkpoint mid-batch saved it). The state is dropped instead: one step skipped, then the
    batch's next windows start afresh and train."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus_file, run_dir, "steps=8", "seq_len=64", "update_len=16", "warmup_steps=100")
    model = TransformerVQ(cfg.model)
    calls = []

    def poison(module, args, out):  # the 2nd window of the 1st batch: its state goes to windows 3 and 4
        if module.training:
            calls.append(1)
            return out * float("nan") if len(calls) == 2 else out
        return out

    model.embed.register_forward_hook(poison)
    train(cfg, model=model)
    rows = [r for r in read_metrics(run_dir) if "skipped" in r]
    assert [r["step"] for r in rows if r["skipped"]] == [2]
    assert all(math.isfinite(r["loss"]) for r in rows if not r["skipped"])
    assert "step 2: the window left the carried attention state non-finite" in capsys.readouterr().out
