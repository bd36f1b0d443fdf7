"""The architecture of a language-model run (``arch``: tvq or longvq): it picks the model config class and presets,
round-trips through config.json (runs saved without it are Transformer-VQ's), and the flags of both model classes
are parsed by `tvq train` with a field of the other architecture refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from transformer_vq.cli import build_parser, main
from transformer_vq.config import ConfigError, LongVQConfig, RunConfig, TransformerVQConfig, load_config
from transformer_vq.config.arch import LM_PRESETS, lm_preset
from transformer_vq.config.fields import kinds


def test_a_longvq_run_config_round_trips_through_json():
    cfg = load_config("tiny", arch="longvq", values={"model": {"d_qk": 8}, "train": {"steps": 3}})
    assert isinstance(cfg.model, LongVQConfig) and cfg.arch == "longvq" and cfg.model.d_qk == 8
    saved = json.loads(cfg.to_json())
    assert saved["arch"] == "longvq" and RunConfig.from_dict(saved) == cfg


def test_a_run_saved_without_arch_is_transformer_vq():
    saved = load_config("tiny").to_dict()
    assert saved.pop("arch") == "tvq"
    cfg = RunConfig.from_dict(saved)
    assert cfg.arch == "tvq" and isinstance(cfg.model, TransformerVQConfig)


def test_presets_and_defaults_of_each_architecture():
    assert load_config(arch="longvq").model == LM_PRESETS["longvq"]["small"]
    small = lm_preset("longvq", "small")
    assert (small.d_model, small.d_qk, small.d_v, small.n_layers, small.block_len) == (256, 64, 512, 2, 64)
    assert load_config().model == lm_preset("tvq", None) == lm_preset("tvq", "small")
    assert lm_preset("longvq", "enwik8").n_layers == 12


@pytest.mark.parametrize("build, message", [
    (lambda: load_config("pg19", arch="longvq"), "unknown model preset 'pg19' of arch 'longvq'; available: enwik8, "
                                                 "tiny, small"),
    (lambda: load_config("gpt2"), "unknown model preset 'gpt2'; available: enwik8, pg19, imagenet64, small, tiny"),
    (lambda: load_config(arch="mamba"), "unknown architecture 'mamba'; available: tvq, longvq"),
    (lambda: RunConfig.from_dict({"arch": "mamba", "model": {}, "train": {}}),
     "unknown architecture 'mamba'; available: tvq, longvq"),
    (lambda: RunConfig.from_dict({"arch": "tvq", "model": {}, "train": {}, "x": 1}),
     "unknown top-level config key(s): x; expected 'task', 'arch', 'model' and 'train'"),
    (lambda: load_config("tiny", overrides=["d_qk=8"]),
     "model field(s) d_qk belong to arch 'longvq', and this run's arch is 'tvq'; give --arch longvq (arch: longvq "
     "in a config file) or leave them out"),
    (lambda: load_config("tiny", arch="longvq", overrides=["model.d_k=8", "attn_type=full"]),
     "model field(s) attn_type, d_k belong to arch 'tvq', and this run's arch is 'longvq'; give --arch tvq (arch: "
     "tvq in a config file) or leave them out"),
    (lambda: load_config("tiny", arch="longvq", overrides=["n_classes=3", "causal=false"]),
     "a language-model run needs n_classes 0, got 3; a LongVQ classifier trains with tvq classify train"),
    (lambda: load_config("tiny", arch="longvq", overrides=["block_len=6"]),
     "invalid RunConfig: update_len must be a multiple of the model's block_len=6 (e.g. 126, or change block_len), "
     "got 128"),
    (lambda: RunConfig(model=object()), "a language-model run takes a TransformerVQConfig or a LongVQConfig, got "
                                        "object"),
    (lambda: load_config(arch="longvq", base=load_config("tiny")), "--arch: the run being resumed trained a 'tvq' "
                                                                   "model, not 'longvq'; leave --arch out to continue "
                                                                   "it, or start a new run with another --run-dir"),
    (lambda: load_config("tiny", arch="longvq", overrides=["torch_compile=true"]),
     "invalid RunConfig: torch_compile compiles Transformer-VQ's gated attention units, which a LongVQ model has none "
     "of (leave it off)"),
], ids=["preset-of-other-arch", "tvq-preset", "arch", "saved-arch", "top-level-key", "longvq-field", "tvq-fields",
        "classifier", "block-len", "model-class", "resume-other-arch", "compile"])
def test_config_errors_name_the_problem(build, message):
    with pytest.raises(ConfigError) as err:
        build()
    assert str(err.value) == message


def test_a_config_file_names_the_architecture_and_the_flag_wins(tmp_path):
    from transformer_vq.cli.train import build_config

    path = tmp_path / "run.yaml"
    path.write_text("arch: longvq\npreset: tiny\nmodel:\n  ema_dim: 3\n")
    cfg = build_config(build_parser().parse_args(["train", "--config", str(path), "--d-ffn", "40"]))
    assert (cfg.arch, cfg.model.ema_dim, cfg.model.d_ffn, cfg.model.d_model) == ("longvq", 3, 40, 32)
    path.write_text("arch: longvq\npreset: tiny\n")
    assert build_config(build_parser().parse_args(["train", "--config", str(path), "--arch", "tvq"])).arch == "tvq"


def test_resuming_continues_the_saved_architecture(tmp_path):
    from transformer_vq.cli.train import build_config

    saved = load_config("tiny", arch="longvq", values={"train": {"run_dir": str(tmp_path)}})
    (tmp_path / "config.json").write_text(saved.to_json())
    cfg = build_config(build_parser().parse_args(["train", "--resume", "--run-dir", str(tmp_path), "--norm", "scale"]))
    assert cfg.model == saved.model.replace(norm="scale")


def test_every_longvq_language_model_field_is_a_flag_with_its_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    squeezed = "".join(text.split())
    for field in dataclasses.fields(LongVQConfig):
        flag = "--" + field.name.replace("_", "-")
        assert (flag in text) == (field.name != "n_classes"), flag  # a language model has no classes
    fields = {f.name: f for f in dataclasses.fields(LongVQConfig)}
    for name in ("d_qk", "d_ffn", "ema_dim", "scoring", "norm", "dropout"):
        assert "".join(fields[name].metadata["help"].split()) in squeezed, name
    assert "--arch {tvq,longvq}" in text and "--norm {layer,batch,scale}" in text


def test_shared_fields_have_the_same_rules_in_both_model_configs():
    """A shared flag is registered once (from TransformerVQConfig): its rules must be LongVQConfig's too (where an
    option applies is each config's own: it names the fields of its class)."""
    tvq = {f.name: f for f in dataclasses.fields(TransformerVQConfig)}
    shared = [f for f in dataclasses.fields(LongVQConfig) if f.name in tvq]
    assert {f.name for f in shared} == {"vocab_size", "d_model", "d_v", "n_layers", "n_code", "block_len", "causal",
                                        "commit_coef", "ema_rate", "dead_code_restart"}
    for field in shared:
        rules = {k: v for k, v in field.metadata.items() if k not in ("help", "applies")}
        assert rules == {k: v for k, v in tvq[field.name].metadata.items() if k not in ("help", "applies")}, field.name
        assert kinds(LongVQConfig)[field.name] == kinds(TransformerVQConfig)[field.name], field.name


@pytest.mark.parametrize("argv, message", [
    (["train", "--arch", "mamba"], "error: --arch: must be one of tvq, longvq, got 'mamba'"),
    (["train", "--d-qk", "8"], "error: model field(s) d_qk belong to arch 'longvq', and this run's arch is 'tvq'; "
                               "give --arch longvq (arch: longvq in a config file) or leave them out"),
    (["train", "--arch", "longvq", "--norm", "group"], "error: --norm: must be one of layer, batch, scale, got "
                                                       "'group'"),
    (["train", "--arch", "longvq", "--preset", "imagenet64"], "error: unknown model preset 'imagenet64' of arch "
                                                              "'longvq'; available: enwik8, tiny, small"),
    # A language model is causal: its refusals offer no "causal false" (refused by tvq train) and name the encoder's
    # command; a classifier, whose causal is free, is still offered it.
    (["train", "--arch", "longvq", "--no-causal"], "error: --causal: false is an encoder's, and an encoder is a "
                                                   "classifier (n_classes > 0; tvq classify train): a language model "
                                                   "(n_classes 0) is causal"),
    (["train", "--arch", "longvq", "--norm", "batch"], "error: --norm: 'batch' mixes the positions of a sequence (its "
                                                       "statistics are taken over time), so a causal model would see "
                                                       "later tokens: use norm 'layer' or 'scale' (a language model "
                                                       "is causal; an encoder classifier trains with tvq classify "
                                                       "train)"),
    (["train", "--arch", "longvq", "--scoring", "relu2"], "error: --scoring: applies only with causal false (this run "
                                                          "has causal true), got 'relu2'; leave it out (a language "
                                                          "model is causal; an encoder classifier trains with tvq "
                                                          "classify train)"),
    (["classify", "train", "--arch", "longvq", "--data", "digits", "--causal", "--scoring", "relu2"],
     "error: --scoring: applies only with causal false (this run has causal true), got 'relu2'; leave it out, or set "
     "causal as it needs"),
])
def test_bad_architecture_flags_exit_2_with_one_line(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    assert capsys.readouterr().err == message + "\n"
