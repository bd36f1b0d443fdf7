"""Paths and names: a run never writes outside its directory, a run directory that is a file, read-only or on a
full disk, and missing or broken data, config and checkpoint files are each one line that names the path."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cliutil import error_line, run_cli, tiny_train
from transformer_vq.config import classify_config, load_config
from transformer_vq.config.load import RESUME_HINT

NAME_RULE = "--name: must name one directory (not empty, '.' or '..', without '/')"
NO_CKPT = ("no checkpoint found in {path}; pass a run directory written by `tvq train` (it has a checkpoints/ "
           "folder) or a checkpoints/step_* directory")
MISSING_CKPT = ("checkpoint path {path} does not exist; pass a run directory (e.g. runs/default) or one of its "
                "checkpoints/step_* directories")

CONFIG_HINT = "pass --config with a text file of 'arch', 'preset', 'model' and 'train' keys (docs/training.md)"
FRACTIONS = ("dataset 'text': option fractions must be three positive numbers (train, validation, test) summing to "
             "1, got {got}; pass --data-option fractions=VALUE with such a value, or leave it out (default (0.9, 0.05, "
             "0.05))")


@pytest.mark.parametrize("name, message", [
    ("..", f"{NAME_RULE}, got '..'"), (".", f"{NAME_RULE}, got '.'"), ("a/b", f"{NAME_RULE}, got 'a/b'"),
    ("", "--name: must not be empty, got ''"),
], ids=["dotdot", "dot", "slash", "empty"])
def test_run_names_stay_inside_runs(capsys, corpus, tmp_path, name, message):
    argv = [a for a in tiny_train(corpus, tmp_path / "x") if a not in ("--run-dir", str(tmp_path / "x"))]
    assert error_line(capsys, [*argv, "--name", name]) == f"error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_run_dir_that_is_a_file(capsys, corpus, tmp_path):
    (tmp_path / "run").write_text("a file")
    assert error_line(capsys, tiny_train(corpus, tmp_path / "run")) == (
        f"error: run directory {tmp_path / 'run'} is a file, not a directory; pass another --run-dir, or move the "
        f"file away")


def test_read_only_run_dir(capsys, corpus, tmp_path, monkeypatch):
    # tests run as root, whom chmod does not stop: the file system's refusal is simulated where it is met
    run_dir, original = tmp_path / "run", Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == run_dir:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert error_line(capsys, tiny_train(corpus, run_dir)) == (
        f"error: cannot create the run directory: {run_dir} is not writable (Permission denied); pass a writable "
        f"--run-dir, or fix the directory's permissions")


def test_full_disk_saves_nothing_unresumable(capsys, corpus, tmp_path, monkeypatch):
    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=5 * 2**29))
    run_dir = tmp_path / "run"
    assert error_line(capsys, tiny_train(corpus, run_dir)) == (
        f"error: cannot save checkpoint step_00000002: no space left on the disk holding {run_dir} (2.5 GiB free; "
        f"nothing saved before was changed); free some space, or pass another --run-dir on a disk with room")
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == []  # no half-written checkpoint


@pytest.mark.parametrize("flags, message", [
    (["--data-path", "{tmp}/nope.txt"], "data path {tmp}/nope.txt does not exist; pass --data-path with an existing "
                                        "text file or directory"),
    (["--data", "text", "--data-path", "{fifo}"], "data path {fifo} is neither a regular file nor a directory; pass "
                                                  "a text file or directory"),
    (["--data", "nope"], "unknown dataset 'nope'; choose one of: shakespeare, text, enwik8, pg19, imagenet64, gcide, "
                         "or the probe recall (e.g. --data shakespeare)"),
    (["--data-option", "foo"], "--data-option: 'foo' must look like KEY=VALUE, e.g. --data-option "
                               "tokenizer=pg19.model"),
    (["--data-option", "foo=1"], "dataset 'text' has no option 'foo'; its options are: glob, fractions, lines"),
    (["--data-option", "glob="], "--data-option: 'glob=' must look like KEY=VALUE, e.g. --data-option "
                                 "tokenizer=pg19.model"),
    (["--data-option", "fractions=null"], FRACTIONS.format(got="None")),
    (["--data-option", "fractions=abc"], FRACTIONS.format(got="'abc'")),
    (["--data-option", "fractions=3"], FRACTIONS.format(got="3")),
    (["--data-option", "fractions=[0.5, 0.5, nan]"], FRACTIONS.format(got="[0.5, 0.5, 'nan']")),
    (["--config", "{tmp}/none.yaml"], "--config: {tmp}/none.yaml does not exist or is not a regular file (a YAML run "
                                      "config was expected); " + CONFIG_HINT),
    (["--config", "{tmp}"], "--config: {tmp} is a directory, not a YAML run config; " + CONFIG_HINT),
    (["--config", "{tmp}/binary.json"], "--config: {tmp}/binary.json is not a JSON run config: it is not UTF-8 text "
                                        "(byte 0x80 at offset 0; a binary file?); " + CONFIG_HINT),
    (["--config", "{tmp}/run.txt"], "config file {tmp}/run.txt must end in .yaml, .yml, .json or .toml"),
    (["--resume", "{tmp}/nowhere"], "--resume: " + MISSING_CKPT.format(path="{tmp}/nowhere")),
    (["--resume", "{tmp}/empty"], NO_CKPT.format(path="{tmp}/empty")),
], ids=["data-path-missing", "data-path-fifo", "data-unknown", "data-option-malformed", "data-option-unknown",
        "data-option-empty-value", "fractions-null", "fractions-word", "fractions-one-number", "fractions-nan",
        "config-missing", "config-directory", "config-binary", "config-txt-suffix", "resume-path-missing",
        "resume-empty-dir"])
def test_train_paths(capsys, corpus, tmp_path, flags, message):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "run.txt").write_text("train:\n  steps: 3\n")
    (tmp_path / "binary.json").write_bytes(pickle.dumps({"steps": 3}))
    (tmp_path / "empty").mkdir()
    values = {"tmp": tmp_path, "fifo": fifo}
    argv = tiny_train(corpus, tmp_path / "run", *[f.format(**values) for f in flags])
    assert error_line(capsys, argv) == f"error: {message.format(**values)}"


@pytest.mark.parametrize("argv", [
    ["train", "--run-dir", ""], ["train", "--data-path", ""], ["train", "--config", ""], ["train", "--resume", ""],
    ["eval", "--ckpt", ""], ["eval", "--data-path", ""], ["sample", "--ckpt", ""],
], ids=["train-run-dir", "train-data-path", "train-config", "train-resume", "eval-ckpt", "eval-data-path",
        "sample-ckpt"])
def test_empty_paths_are_not_the_current_directory(capsys, argv):
    assert error_line(capsys, argv) == f"error: {argv[1]}: must not be empty, got ''"


def test_data_path_without_its_corpus(capsys, corpus):
    assert error_line(capsys, ["train", "--data-path", str(corpus)]) == (
        "error: --data-path: name the corpus it holds with --data (text for your own text file or directory; "
        "shakespeare, enwik8, pg19, imagenet64 or gcide for a downloaded copy)")


@pytest.mark.parametrize("name, text, start, where", [
    ("bad.yaml", "model: [1,\n", "is not valid YAML: ", "line 2, column 1"),
    ("bad.json", '{"model": {"d_model": 32,', "is not valid JSON: ", "line 1, column 26"),
    ("bad.toml", "model = [\n", "is not valid TOML: ", "Invalid value (at end of document)"),
    ("twice.yaml", "model:\n  d_model: 64\nmodel:\n  d_model: 32\n", "is not valid YAML: ",
     "key 'model' is given twice"),
    ("twice.json", '{"train": {"steps": 2, "steps": 3}}', "is not valid JSON: ", "key 'steps' is given twice"),
], ids=["yaml", "json", "toml", "yaml-key-twice", "json-key-twice"])
def test_config_file_that_does_not_parse(capsys, corpus, tmp_path, name, text, start, where):
    (tmp_path / name).write_text(text)
    line = error_line(capsys, tiny_train(corpus, tmp_path / "run", "--config", str(tmp_path / name)))
    assert line.startswith(f"error: {tmp_path / name} {start}") and where in line


@pytest.mark.parametrize("text, message", [
    ("- 1\n- 2\n", "{path} must hold a mapping with 'arch', 'preset', 'model' and/or 'train' keys"),
    ("model: 3\n", "'model' in {path} must be a mapping of field: value, got 3"),
    ("foo: 1\n", "unknown top-level key(s) in {path}: foo; a config file has 'arch', 'preset', 'model' and 'train'"),
], ids=["a-list", "section-not-a-mapping", "unknown-top-level-key"])
def test_config_file_of_the_wrong_shape(capsys, corpus, tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    line = error_line(capsys, tiny_train(corpus, tmp_path / "run", "--config", str(path)))
    assert line == f"error: {message.format(path=path)}"


def test_config_file_with_an_unknown_key(capsys, corpus, tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  nope: 1\n")
    line = error_line(capsys, tiny_train(corpus, tmp_path / "run", "--config", str(tmp_path / "run.yaml")))
    assert line.startswith("error: unknown model config key(s): nope; known keys: abs_pos, attn_backend, attn_type, "
                           "bias_span, block_len")


def test_corrupted_run_config(capsys, corpus, finished_run):
    (finished_run / "config.json").write_text('{"model": {"d_model": 32,')
    line = error_line(capsys, ["train", "--resume", "--run-dir", str(finished_run), "--steps", "4"])
    assert line == (f"error: {finished_run / 'config.json'} is not a run's saved config (config.json): invalid JSON "
                    f"at line 1, column 26 (Expecting property name enclosed in double quotes); {RESUME_HINT}")
    # --preset no longer skips the saved config (it replaces the model's fields only): the file is read all the same
    assert error_line(capsys, ["train", "--resume", "--run-dir", str(finished_run), "--preset", "tiny"]) == line


def test_classify_train_resuming_a_broken_run_config(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"task": "classify", "model": {}, "train": {"arch": "longvq"}, "x": 1}')
    line = error_line(capsys, ["classify", "train", "--resume", "--run-dir", str(tmp_path)])
    assert line == (f"error: {tmp_path / 'config.json'} is not a valid run config (a classification run config is a "
                    f"mapping with 'model' and 'train' (and 'task', 'recipe')); {RESUME_HINT}")


@pytest.mark.parametrize("command, other", [("train", "classify"), ("classify train", "lm")])
def test_resuming_a_run_of_the_other_task_names_its_command(capsys, tmp_path, command, other):
    """Each training command, given a run of the other one, names it (as tvq eval and tvq classify eval do) rather
    than calling the config damaged."""
    cfg = (load_config("tiny") if other == "lm" else
           classify_config(n_classes=2, vocab_size=5, preset="tiny", train={"arch": "transformer"}))
    (tmp_path / "config.json").write_text(cfg.to_json())
    line = error_line(capsys, [*command.split(), "--resume", "auto", "--run-dir", str(tmp_path), "--steps", "5"])
    held, continues, task = ((f"a Transformer-VQ language model (a run of tvq train --arch tvq)", "classifiers",
                              "tvq train") if other == "lm" else
                             ("a full-attention Transformer classifier (baseline) (a run of tvq classify train --arch "
                              "transformer)", "language models", "tvq classify train"))
    assert line == (f"error: --resume: {tmp_path / 'config.json'} holds {held}, and tvq {command} continues "
                    f"{continues} only; continue this run with {task} --resume, or start a new one with another "
                    f"--run-dir")


@pytest.mark.parametrize("command", ["eval", "sample"])
@pytest.mark.parametrize("where, message", [
    ("nowhere", MISSING_CKPT), ("file", NO_CKPT), ("empty", NO_CKPT),
], ids=["missing", "a-file", "no-checkpoints"])
def test_ckpt_paths(capsys, tmp_path, command, where, message):
    (tmp_path / "file").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    path = tmp_path / where
    assert error_line(capsys, [command, "--ckpt", str(path)]) == f"error: {message.format(path=path)}"


@pytest.mark.parametrize("damage", ["truncated-weights", "edited-config"])
@pytest.mark.parametrize("command", ["eval", "sample", "resume"])
def test_damaged_checkpoint(capsys, finished_run, command, damage):
    step = finished_run / "checkpoints" / "step_00000002"
    name = {"truncated-weights": "model.safetensors", "edited-config": "config.json"}[damage]
    if damage == "truncated-weights":
        (step / name).write_bytes((step / name).read_bytes()[:100])
    else:
        (step / name).write_text(json.dumps({"model": 3}))
    argv = {"eval": ["eval", "--ckpt", str(finished_run)], "sample": ["sample", "--ckpt", str(finished_run)],
            "resume": ["train", "--resume", "--run-dir", str(finished_run), "--steps", "4"]}[command]
    # each command's own remedy: a reader of the run is not told to use training's flags
    remedy = ("start a new run with another --run-dir or without --resume" if command == "resume" else
              "pass --ckpt a run directory or a checkpoints/step_* directory whose checkpoint is intact")
    assert error_line(capsys, argv) == (f"error: no complete checkpoint in {finished_run / 'checkpoints'}: every one "
                                        f"failed verification (see warnings above); {remedy}")


def test_damaged_checkpoint_warning_names_the_file(capsys, finished_run):
    step = finished_run / "checkpoints" / "step_00000002"
    (step / "model.safetensors").write_bytes(b"")
    code, err = run_cli(capsys, ["eval", "--ckpt", str(finished_run)])
    assert code == 2
    assert err.splitlines()[0] == (f"warning: skipping checkpoint: checkpoint {step} is corrupted: model.safetensors "
                                   f"does not match its checksum (truncated or modified after saving)")


def test_data_path_of_eval_missing(capsys, trained, tmp_path):
    line = error_line(capsys, ["eval", "--ckpt", str(trained), "--data-path", str(tmp_path / "nope")])
    assert line == (f"error: data path {tmp_path / 'nope'} does not exist; pass --data-path with an existing text "
                    f"file or directory")


def test_data_path_of_sample_from_a_byte_model(capsys, trained, corpus):
    line = error_line(capsys, ["sample", "--ckpt", str(trained), "--data-path", str(corpus)])
    assert line == ("error: --data-path: this model reads bytes (vocab_size 256) and needs no corpus to encode or "
                    "decode text; leave --data-path out")


@pytest.mark.parametrize("layout, message", [
    ("missing", "PG-19 root {root} is not a directory; pass --data-path with the directory holding train/, "
                "validation/ and test/."),
    ("no-books", "{root}/train contains no .txt books; PG-19 splits are directories of one .txt file per book."),
], ids=["missing", "no-books"])
def test_tokenizer_paths(capsys, tmp_path, layout, message):
    root = tmp_path / "pg19"
    if layout == "no-books":
        (root / "train").mkdir(parents=True)
    line = error_line(capsys, ["tokenizer", "--data-path", str(root)])
    assert line == (f"error: {message.format(root=root)} PG-19 is at https://github.com/google-deepmind/pg19 "
                    f"(gs://deepmind-gutenberg)")


def test_yaml_merge_keys_are_yaml_and_not_a_key_given_twice(tmp_path):
    """``<<: *anchor`` merges a mapping, its keys overridden by the mapping's own, as YAML defines (the duplicate-key
    check refused every merge as "not valid YAML"); a key given twice beside a merge is still refused."""
    from transformer_vq.config import ConfigError
    from transformer_vq.config.load import read_file

    path = tmp_path / "run.yaml"
    path.write_text("model: &tiny {d_model: 32, n_layers: 1}\ntrain: {steps: 3, <<: {steps: 9, seed: 2}}\n")
    assert read_file(path)["train"] == {"steps": 3, "seed": 2}
    path.write_text("model: &m {d_model: 32}\ntrain: {steps: 3, steps: 4, <<: {seed: 2}}\n")
    with pytest.raises(ConfigError, match="key 'steps' is given twice"):
        read_file(path)
    # an anchored mapping that merges and overrides itself, merged again by a shallower mapping after YAML has
    # flattened it (its merged keys once read as given twice)
    path.write_text("train:\n  data_options: &o\n    <<: {lines: false}\n    lines: true\n  steps: 3\n"
                    "model:\n  <<: *o\n")
    assert read_file(path) == {"train": {"data_options": {"lines": True}, "steps": 3}, "model": {"lines": True}}


def test_a_run_s_config_json_is_a_config_file_that_starts_a_run_like_it(capsys, trained, tmp_path):
    """Its fields are a full record, defaults of options that do not apply included (``mask_rate`` in a causal
    model): read as options given, every saved run's config was refused as a --config file."""
    code, _ = run_cli(capsys, ["train", "--config", str(trained / "config.json"), "--run-dir", str(tmp_path / "b"),
                               "--steps", "1"])
    assert code == 0
    old, new = (json.loads((run / "config.json").read_text()) for run in (trained, tmp_path / "b"))
    assert new["model"] == old["model"] and new["train"]["seq_len"] == old["train"]["seq_len"]
    assert new["train"]["steps"] == 1
    # a field a user writes where it does not apply is still refused
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"model": {"mask_rate": 0.2}}))
    assert "--mask-rate: applies only with causal false" in error_line(
        capsys, ["train", "--config", str(mine), "--run-dir", str(tmp_path / "c")])


def test_a_classifier_s_config_json_is_refused_by_name_as_a_language_model_s_config(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "classify", "arch": "longvq", "model": {}, "train": {}}))
    assert error_line(capsys, ["train", "--config", str(path)]) == (
        f"error: --config: {path} is the config of a run of task 'classify', not a language model's; "
        f"tvq classify train --resume continues such a run")
