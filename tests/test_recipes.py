"""Per-dataset classifier recipes (transformer_vq.config.recipes): applied only where no preset is given, under the
user's fields, to encoders only, recorded in the run config; and the command line's run records them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from transformer_vq.cli import main
from transformer_vq.config import ClassifyConfig, ClassifyTrainConfig, LongVQConfig, classify_config
from transformer_vq.config.longvq import CLASSIFY_PRESETS
from transformer_vq.config.recipes import CLASSIFY_RECIPES, Recipe, find_recipe

DIGITS = find_recipe("longvq", "digits")


def build(**kwargs):
    return classify_config(n_classes=10, vocab_size=17, **kwargs)


def test_the_recipe_sets_its_fields_and_records_them():
    cfg = build(train={"data": "digits"})
    assert cfg.recipe == {"model": dict(DIGITS.model), "train": dict(DIGITS.train)}
    assert (cfg.model.norm, cfg.model.dropout, cfg.train.lr, cfg.train.grad_clip) == ("batch", 0.0, 1e-2, 1.0)
    assert cfg.model.causal is False and cfg.model.d_model == 64  # the small preset's size, as an encoder
    assert ClassifyConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_the_users_fields_win_and_are_not_recorded_as_the_recipes():
    cfg = build(model={"norm": "scale"}, train={"data": "digits", "lr": 3e-3})
    assert (cfg.model.norm, cfg.train.lr) == ("scale", 3e-3)
    assert cfg.recipe == {"model": {"dropout": 0.0}, "train": {"grad_clip": 1.0}}


@pytest.mark.parametrize("kwargs", [
    {"preset": "small", "train": {"data": "digits"}},  # a preset: the bare preset and the training defaults
    {"train": {"data": "digits", "arch": "transformer"}},  # no recipe for this arch
    {"train": {"data": "pathfinder"}},  # nor for this dataset
    {"model": {"causal": True}, "train": {"data": "digits"}},  # recipes are an encoder's (batch norm)
], ids=["preset", "other-arch", "other-data", "causal"])
def test_no_recipe(kwargs):
    cfg = build(**kwargs)
    plain = LongVQConfig.__dataclass_fields__
    assert cfg.recipe == {}
    assert (cfg.model.norm, cfg.train.lr, cfg.train.grad_clip) == (plain["norm"].default, 2e-3, 0.1)


def test_a_resumed_config_keeps_its_recipe():
    base = build(train={"data": "digits"})
    resumed = build(base=base, train={"steps": 5})
    assert resumed.recipe == base.recipe and resumed.model == base.model and resumed.train.lr == 1e-2


def test_a_preset_over_a_resumed_config_keeps_its_training_fields_and_their_recipe_record():
    base = build(train={"data": "digits"})
    restarted = build(base=base, preset="small")
    assert restarted.model.norm == "layer" and restarted.train == base.train
    assert restarted.recipe == {"model": {}, "train": dict(DIGITS.train)}  # the preset replaced the model's fields


def test_a_resumed_configs_recipe_record_drops_the_fields_given_now():
    base = build(train={"data": "digits"})
    resumed = build(base=base, model={"dropout": 0.1}, train={"lr": 3e-3})
    assert (resumed.model.dropout, resumed.train.lr, resumed.train.grad_clip) == (0.1, 3e-3, 1.0)
    assert resumed.recipe == {"model": {"norm": "batch"}, "train": {"grad_clip": 1.0}}


def test_a_recipe_field_that_does_not_apply_is_left_out():
    """A recipe's field that the user's choices leave unread, where the user's own would be refused (grad_clip:
    adamw's only), is left out, not refused: the config keeps the field's default and the run neither records it nor
    announces it (it recorded and announced grad_clip 1.0 under adafactor). A resumed run's record drops it too."""
    cfg = build(train={"data": "digits", "optimizer": "adafactor"})
    assert cfg.recipe == {"model": dict(DIGITS.model), "train": {"lr": 1e-2}}
    assert (cfg.train.lr, cfg.train.grad_clip) == (1e-2, ClassifyTrainConfig.__dataclass_fields__["grad_clip"].default)
    assert build(base=cfg, train={"steps": 5}).recipe == cfg.recipe
    # a run recorded before: the field stays the run's, its record goes
    old = dataclasses.replace(cfg, recipe={**cfg.recipe, "train": dict(DIGITS.train)})
    assert build(base=old, train={"steps": 5}).recipe == cfg.recipe


def test_a_recipe_field_the_arch_does_not_read_is_left_out(monkeypatch):
    """The same for a field the recipe's architecture refuses (a Transformer classifier has no blocks)."""
    monkeypatch.setitem(CLASSIFY_RECIPES, ("transformer", "digits"), Recipe(model={"block_len": 64, "dropout": 0.0},
                                                                            train={"lr": 1e-2}))
    cfg = build(train={"data": "digits", "arch": "transformer"})
    assert cfg.recipe == {"model": {"dropout": 0.0}, "train": {"lr": 1e-2}}
    assert (cfg.model.block_len, cfg.model.dropout) == (CLASSIFY_PRESETS["small"].block_len, 0.0)


def test_listops_takes_its_recipe():
    cfg = build(train={"data": "listops"})
    assert (cfg.model.norm, cfg.model.dropout, cfg.model.block_len, cfg.train.lr, cfg.train.grad_clip) == (
        "batch", 0.0, 64, 5e-3, 1.0)
    assert cfg.recipe == {"model": dict(find_recipe("longvq", "listops").model),
                          "train": dict(find_recipe("longvq", "listops").train)}
    assert build(train={"data": "listops", "arch": "transformer"}).recipe == {}


def test_every_recipe_builds_a_valid_encoder():
    for (arch, data), recipe in CLASSIFY_RECIPES.items():
        cfg = build(train={"data": data, "arch": arch})
        assert cfg.recipe["model"] == dict(recipe.model) and cfg.recipe["train"] == dict(recipe.train)
        assert recipe.source.startswith("benchmarks/results/")


def test_the_command_line_records_and_announces_the_recipe(tmp_path, capsys):
    pytest.importorskip("sklearn")
    run = tmp_path / "run"
    assert main(["classify", "train", "--data", "digits", "--run-dir", str(run), "--steps", "1", "--batch-size", "4",
                 "--d-model", "16", "--d-v", "16", "--d-ffn", "16", "--lr", "5e-3", "--device", "cpu"]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["recipe"] == {"model": {"norm": "batch", "dropout": 0.0}, "train": {"grad_clip": 1.0}}
    assert (saved["model"]["norm"], saved["train"]["lr"], saved["model"]["d_model"]) == ("batch", 5e-3, 16)
    assert "digits's recipe for longvq set norm batch, dropout 0.0, grad_clip 1.0" in capsys.readouterr().out
    help_text = pytest.raises(SystemExit, main, ["classify", "train", "--help"])
    assert help_text.value.code == 0
    assert "longvq on digits: norm batch" in " ".join(capsys.readouterr().out.split())


def test_resuming_with_a_preset_keeps_the_runs_training_fields_and_recipe_record(tmp_path):
    pytest.importorskip("sklearn")
    run, small = tmp_path / "run", ["--d-model", "16", "--d-v", "16", "--d-ffn", "16", "--batch-size", "4"]
    common = ["classify", "train", "--data", "digits", "--run-dir", str(run), "--device", "cpu", *small]
    assert main([*common, "--steps", "1"]) == 0
    # the recipe's model fields given as flags: the preset replaces the model's fields, which must match the run's
    assert main([*common, "--steps", "2", "--resume", "auto", "--preset", "small", "--norm", "batch", "--dropout",
                 "0", "--warmup-steps", "7"]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert (saved["train"]["lr"], saved["train"]["grad_clip"], saved["train"]["warmup_steps"]) == (1e-2, 1.0, 7)
    assert saved["recipe"] == {"model": {}, "train": {"lr": 1e-2, "grad_clip": 1.0}}
