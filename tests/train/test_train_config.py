"""Run configuration: presets, YAML / TOML files, overrides, precedence, and the saved JSON."""

from __future__ import annotations

import json
import sys

import pytest

from transformer_vq.cli import build_parser
from transformer_vq.train import ConfigError, RunConfig, TrainConfig, load_config


def test_defaults_are_the_small_model_on_shakespeare():
    cfg = load_config()
    assert cfg.model.d_model == 256 and cfg.train.data == "shakespeare"
    assert cfg.train.peak_lr == 2e-3
    # lr=none: the paper's value for the optimizer
    assert load_config(overrides=["lr=none"]).train.peak_lr == 4e-4
    assert load_config(overrides=["optimizer=adafactor", "lr=none"]).train.peak_lr == 1e-2
    assert str(cfg.train.resolved_run_dir()) == "runs/default"


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: tiny\nmodel:\n  n_layers: 2\ntrain:\n  steps: 50\n  lr: 1.0e-3\n")
    cfg = load_config(file=path, overrides=["train.steps=70", "model.dropres=0.1", "lr=2e-3"])
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.dropres) == (32, 2, 0.1)
    assert (cfg.train.steps, cfg.train.lr) == (70, 2e-3)
    assert load_config("small", file=path).model.d_model == 256  # an explicit preset wins over the file's


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TOML needs tomllib (Python 3.11) or tomli")
def test_toml_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('preset = "tiny"\n[train]\nsteps = 9\nprecision = "bfloat16"\n')
    cfg = load_config(file=path)
    assert (cfg.model.d_model, cfg.train.steps, cfg.train.precision) == (32, 9, "bfloat16")


@pytest.mark.parametrize("text, message", [
    ("trian:\n  steps: 5\n", "unknown top-level key(s) in {path}: trian; a config file has 'arch', 'preset', "
                              "'model' and 'train'"),
    ("train:\n  stepz: 5\n", "unknown train config key(s): stepz; known keys: batch_size, ckpt_every, "
                              "collective_timeout, context_parallel"),
    ("train:\n  steps: 5.5\n", "invalid TrainConfig: steps must be an integer, got 5.5"),
    ("train:\n  steps: '1e400'\n", "train.steps must be an integer (digits only, without a decimal point or "
                                    "exponent), got '1e400'"),
    ("train:\n  lr: .inf\n", "invalid TrainConfig: lr must be a finite number, got inf"),
    ("train: [1, 2]\n", "'train' in {path} must be a mapping of field: value, got [1, 2]"),
])
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    assert str(err.value).startswith(message.format(path=path))


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match=r"^--set: 'steps' must look like KEY=VALUE, e.g. --set steps=100$"):
        load_config(overrides=["steps"])
    with pytest.raises(ConfigError, match=r"^--set: unknown config section 'optim' in 'optim.lr=1'; use model.FIELD "):
        load_config(overrides=["optim.lr=1"])


def test_round_trip_through_json():
    cfg = load_config("tiny", overrides=["lr=1e-3", "data_path=/data/x.txt", "sample_prompt=ROMEO:"])
    assert RunConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_resume_base_keeps_saved_settings():
    saved = load_config("tiny", overrides=["steps=40", "model.n_layers=2"])
    cfg = load_config(overrides=["steps=80"], base=saved)
    assert (cfg.model.n_layers, cfg.train.steps) == (2, 80)


def test_every_train_field_is_a_flag_with_its_docstring(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in TrainConfig.__dataclass_fields__:
        # a mapping field has a repeatable singular flag: --data-option KEY=VALUE
        flag = "--data-option KEY=VALUE" if name == "data_options" else f"--{name.replace('_', '-')}"
        assert flag in help_text
    assert "Backprop window W: one optimizer step per window of this many tokens (a multiple of block_len). " \
           "(default: 128)" in help_text
    args = parser.parse_args(["train", "--update-len", "64", "--seq-len", "128"])
    from transformer_vq.cli.train import build_config

    assert (build_config(args).train.update_len, build_config(args).train.seq_len) == (64, 128)
