"""TransformerVQConfig: every bad value has its own message; presets and round trips."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import transformer_vq.config as config_package
from transformer_vq import TransformerVQConfig, preset
from transformer_vq.config.fields import kinds


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
    ("d_model", 7, "d_model must be even (sinusoid tables pair sin and cos), got 7"),
    ("d_k", 2.5, "d_k must be an integer, got 2.5"),
    ("n_code", -3, "n_code must be a positive integer, got -3"),
    ("block_len", True, "block_len must be an integer, got True"),
    ("head_type", "gqa", "head_type must be one of shga, mqa, mha, got 'gqa'"),
    ("attn_type", "linear", "attn_type must be one of vq, full, flash_quad, flash, got 'linear'"),
    ("reduction", "scan", "reduction must be one of serial, matmul, assoc, got 'scan'"),
    ("n_head", 2, "n_head must be 1 for head_type 'shga' (use 'mqa' or 'mha'), got 2"),
    ("dropres", 1.0, "dropres must be in [0, 1), got 1.0"),
    ("ema_rate", 1.0, "ema_rate must be in (0, 1), got 1.0"),
    ("commit_coef", -1e-4, "commit_coef must be >= 0, got -0.0001"),
    ("dead_code_restart", -1, "dead_code_restart must be an integer >= 0, got -1"),
    ("max_wavelength", 1.0, "max_wavelength must be > 1, got 1.0"),
    ("commit_coef", float("nan"), "commit_coef must be a finite number, got nan"),
    ("max_wavelength", float("inf"), "max_wavelength must be a finite number, got inf"),
    ("n_layers", 2**63, "n_layers is too large (at most 9223372036854775807), got 9223372036854775808"),
])
def test_each_bad_value_has_its_own_message(field, value, message):
    with pytest.raises(ValueError) as error:
        TransformerVQConfig(**{field: value})
    assert message in str(error.value)


def test_heads_must_divide_value_width():
    with pytest.raises(ValueError, match="d_v must be divisible by n_head=3, got 100"):
        TransformerVQConfig(head_type="mha", n_head=3, d_v=100)


def test_several_errors_are_reported_together():
    with pytest.raises(ValueError) as error:
        TransformerVQConfig(vocab_size=0, reduction="x")
    assert "vocab_size must be" in str(error.value) and "reduction must be" in str(error.value)


def test_dict_round_trip_and_unknown_keys():
    cfg = preset("small", n_layers=3)
    assert TransformerVQConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown model config key\\(s\\): n_layer;"):
        TransformerVQConfig.from_dict({"n_layer": 3})


@pytest.mark.parametrize("values, match", [({"modle": {"d_model": 64}}, "unknown section\\(s\\) 'modle'"),
                                           ({"model": 3}, "values\\['model'\\] must be a mapping")])
def test_typed_values_of_an_unknown_section_are_a_config_error(values, match):
    from transformer_vq.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=match):  # was a bare KeyError: 'modle'
        load_config(values=values)


def test_presets():
    assert preset("enwik8").d_v == 2 * preset("enwik8").d_model
    assert preset("pg19").vocab_size == 32000 and preset("pg19").tie_embeddings
    assert preset("imagenet64").abs_pos
    with pytest.raises(ValueError, match="unknown preset 'gpt2'; available: enwik8, pg19, imagenet64, small, tiny"):
        preset("gpt2")


def test_groups_follow_head_type():
    assert TransformerVQConfig(head_type="mqa", n_head=4).n_kv_head == 1
    assert TransformerVQConfig(head_type="mha", n_head=4).n_kv_head == 4
    assert TransformerVQConfig(head_type="mha", n_head=4).d_v_head == 1536 // 4


def test_enumerations_and_training_only_fields_live_on_the_config():
    from transformer_vq.config import ATTN_TYPES, HEAD_TYPES, REDUCTIONS, TRAINING_ONLY_FIELDS

    assert (HEAD_TYPES, ATTN_TYPES, REDUCTIONS) == (("shga", "mqa", "mha"), ("vq", "full", "flash_quad", "flash"),
                                                    ("serial", "matmul", "assoc"))
    assert TRAINING_ONLY_FIELDS == {"dropsin", "dropres", "droplyr", "commit_coef", "ema_rate", "dead_code_restart",
                                    "reduction", "mask_rate", "attn_backend"}


def config_classes() -> list[type]:
    """Every config dataclass of transformer_vq.config and of the benchmarks (their fields are flags)."""
    names = [f"transformer_vq.config.{m.name}" for m in pkgutil.iter_modules(config_package.__path__)]
    found = []
    for module in map(importlib.import_module, [*names, "transformer_vq.bench.config"]):
        found += [obj for obj in vars(module).values() if isinstance(obj, type) and dataclasses.is_dataclass(obj)
                  and obj.__module__ == module.__name__ and any("help" in f.metadata for f in dataclasses.fields(obj))]
    return found


def test_every_numeric_config_field_declares_its_range():
    """A negative or zero value is refused wherever it is meaningless: every int and float field says which values
    it takes (a field of a new config without a range fails here)."""
    classes = config_classes()
    assert {"TransformerVQConfig", "LongVQConfig", "TrainConfig", "OpBenchConfig", "AblateConfig"} <= \
        {c.__name__ for c in classes}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if kinds(cls)[f.name].base in (int, float):
                assert "min" in f.metadata or "max" in f.metadata, f"{cls.__name__}.{f.name} declares no range"


def test_list_options_refuse_a_repeated_value():
    """A list option names things to run or report once each: ``tvq ablate --seeds 0 0`` reported one training as
    two seeds with a spread of 0 (new-user audit); every list field of every config refuses a repeat."""
    from transformer_vq.config import ConfigError
    from transformer_vq.config.ablate import AblateConfig

    with pytest.raises(ConfigError, match=r"seeds must not repeat a value \(0 given twice\)"):
        AblateConfig(matrix="recall", seeds=(0, 1, 0))
    assert AblateConfig(matrix="recall", seeds=(1, 0)).seeds == (1, 0)


def test_a_misspelt_keyword_is_refused_with_the_known_names():
    """``preset("tiny", nlayers=2)``, ``longvq_preset``, ``config.replace`` and the jobs' keywords
    (``evaluate(ckpt, max_token=...)``) name the unknown key and the known ones (they got dataclasses' TypeError)."""
    from transformer_vq.config import ConfigError, EvalConfig, longvq_preset, preset
    from transformer_vq.config.jobs import job_config

    with pytest.raises(ConfigError, match=r"^unknown TransformerVQConfig key\(s\): nlayers; known keys: .*n_layers"):
        preset("tiny", nlayers=2)
    with pytest.raises(ConfigError, match=r"^unknown LongVQConfig key\(s\): nlayer; known keys: .*n_layers"):
        longvq_preset("tiny", nlayer=1)
    with pytest.raises(ConfigError, match=r"^unknown EvalConfig key\(s\): max_token; known keys: .*max_tokens"):
        job_config(EvalConfig, "runs/x", max_token=3)


def test_a_yaml_merge_key_given_twice_in_one_mapping_is_refused(tmp_path):
    """Two ``<<:`` in one mapping were taken (YAML keeps the last, the first mapping's keys lost) where every other
    key given twice is refused; one ``<<:`` with a list, and one per mapping, are YAML's own and still read."""
    from transformer_vq.config import ConfigError
    from transformer_vq.config.load import read_file

    path = tmp_path / "run.yaml"
    path.write_text("train:\n  <<: {batch_size: 2}\n  <<: {seed: 4}\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"merge key '<<' is given twice .*'<<: \[\*a, \*b\]'"):
        read_file(path)
    path.write_text("model: &m {d_model: 32}\ntrain:\n  d: &d {<<: {seed: 1}, <<: {steps: 2}}\n")  # in an anchor
    with pytest.raises(ConfigError, match="merge key '<<' is given twice"):
        read_file(path)
    path.write_text("train:\n  <<: [{batch_size: 2}, {seed: 4}]\n  steps: 3\nmodel: {<<: {d_model: 32}}\n")
    assert read_file(path) == {"train": {"batch_size": 2, "seed": 4, "steps": 3}, "model": {"d_model": 32}}
    path.write_text("train:\n  '<<': {batch_size: 2}\n  steps: 3\n")  # a quoted '<<' is a plain key, not a merge
    assert read_file(path) == {"train": {"<<": {"batch_size": 2}, "steps": 3}}


def test_install_advice_in_help_quotes_its_extras(capsys):
    """``pip install -e .[hf]`` unquoted is refused by zsh ("no matches found"): every help text quotes the extras
    (``'.[hf]'``), as every message does; ``tvq export --help`` printed it unquoted."""
    import re

    from transformer_vq.cli import main

    unquoted = re.compile(r"(?<!['\"])\.\[\w+(,\w+)*\]")
    for cls in config_classes():
        for f in dataclasses.fields(cls):
            assert not unquoted.search(f.metadata.get("help", "")), f"{cls.__name__}.{f.name}"
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--help"])
    assert exit_.value.code == 0
    assert "`pip install -e '.[hf]'`" in " ".join(capsys.readouterr().out.split())
