"""Optimizers and schedule as in the paper (App. C.2)."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_vq import TransformerVQ, preset
from trainutil import tiny_config
from transformer_vq.train import TrainConfig, train
from transformer_vq.train.optim import build_optimizer, build_scheduler, lr_factor, param_groups, warmup_note


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    f = [lr_factor(s, warmup_steps=10, total_steps=110, final_ratio=0.1) for s in range(110)]
    assert f[0] == pytest.approx(0.1) and f[4] == pytest.approx(0.5) and f[9] == 1.0
    assert f[10] == 1.0
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert f[109] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_weight_decay_only_on_matrices():
    model = TransformerVQ(preset("tiny"))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim <= 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert no_decay["params"]  # the model has gains / biases, and they are exempt


def test_adamw_settings_and_schedule():
    model = TransformerVQ(preset("tiny"))
    cfg = TrainConfig(warmup_steps=4, steps=20, lr=None)
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.9, 0.98), 1e-9)
    sched = build_scheduler(opt, cfg)
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-4 / 4)  # first warmup step
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-4)


def test_adafactor_paper_settings():
    model = TransformerVQ(preset("tiny"))
    opt = build_optimizer(model, TrainConfig(optimizer="adafactor", lr=None))
    assert isinstance(opt, torch.optim.Adafactor)
    group = opt.param_groups[0]
    # relative step sizes with max lr 0.01, update clip d = 1, beta2_t = 1 - t^-0.8, no first moment
    assert (group["lr"], group["d"], group["beta2_decay"]) == (1e-2, 1.0, -0.8)


def test_adafactor_trains(corpus_file, tmp_path):
    from trainutil import read_metrics, tiny_config
    from transformer_vq.train import train

    run_dir = tmp_path / "run"
    train(tiny_config(corpus_file, run_dir, "steps=8", "optimizer=adafactor", "lr=none"))
    losses = [r["loss"] for r in read_metrics(run_dir)]
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_a_run_that_ends_in_its_warmup_says_so():
    assert warmup_note(warmup_steps=10, total_steps=11) is None
    note = warmup_note(warmup_steps=50, total_steps=10)
    assert "warmup_steps 50 >= steps 10" in note and "20% of its peak" in note  # step 9 of 50: 10/50
    assert "100% of its peak" in warmup_note(warmup_steps=10, total_steps=10)


def test_training_prints_the_warmup_warning_once_at_its_start(corpus_file, tmp_path, capsys):
    assert train(tiny_config(corpus_file, tmp_path / "short", "steps=2")).exit_code == 0  # warmup_steps 5
    out = capsys.readouterr().out
    assert out.count("warning: warmup_steps 5 >= steps 2") == 1 and "40% of its peak" in out
    assert train(tiny_config(corpus_file, tmp_path / "long", "steps=6")).exit_code == 0
    assert "warmup_steps" not in capsys.readouterr().out
