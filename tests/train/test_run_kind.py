"""Runs know what they are (issue 21, item 4): a run records its task; each command refuses a run of another kind,
naming the kind and the commands that serve it; a resume refuses a change of a field that defines the run's data."""

from __future__ import annotations

import json

import pytest

from trainutil import tiny_config, tiny_overrides
from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.train import load_config, train


@pytest.fixture(scope="module")
def lm_run(corpus_file, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("kind") / "run"
    assert train(tiny_config(corpus_file, run_dir, "steps=2")).exit_code == 0
    return run_dir


def test_a_run_records_its_task(lm_run):
    assert json.loads((lm_run / "config.json").read_text())["task"] == "lm"


@pytest.mark.parametrize("field, value, saved", [("seed", "3", 0), ("seq_len", "64", 32)])
def test_resume_refuses_a_change_of_the_data(corpus_file, lm_run, field, value, saved):
    cfg = tiny_config(corpus_file, lm_run, "steps=4", f"{field}={value}")
    with pytest.raises(ConfigError) as err:
        train(cfg, resume="auto")
    flag = "--" + field.replace("_", "-")
    assert str(err.value).startswith(f"{flag}: the run in {lm_run}/checkpoints/step_00000002 was trained with {field} "
                                     f"{saved} and this run asks for {value}; {field} defines the run's data, which a "
                                     f"resumed run keeps: leave it out (or give {saved}) to continue, or start a new "
                                     f"run with another --run-dir")


def test_a_data_option_at_its_default_is_the_run_s_data_and_another_value_is_refused(corpus_file, lm_run, capsys):
    """The run saved no data options; spelling out the loader's default loads the same data and resumes. Another value
    is refused, with flags that can be given back (not "give {}")."""
    def with_lines(lines: bool):
        return load_config("tiny", overrides=tiny_overrides(corpus_file, lm_run, "steps=2"),
                           values={"train": {"data_options": {"lines": lines}}})

    assert train(with_lines(False), resume="auto").exit_code == 0
    with pytest.raises(ConfigError, match=r"^--data-option: the run in .* was trained with data_options \{\} and this "
                                          r"run asks for \{'lines': True\}; .*leave it out \(or give no "
                                          r"--data-option\) to continue"):
        train(with_lines(True), resume="auto")


def test_classify_eval_names_the_command_of_a_language_model_run(lm_run, capsys):
    assert main(["classify", "eval", "--ckpt", str(lm_run)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --ckpt: {lm_run}/checkpoints/step_00000002 holds a Transformer-VQ language model (a run of "
                   f"tvq train --arch tvq), and tvq classify eval reads a LongVQ classifier (tvq classify train --arch "
                   f"longvq) or a full-attention Transformer classifier (baseline) (tvq classify train --arch "
                   f"transformer) or a Transformer-VQ encoder classifier (baseline) (tvq classify train --arch tvq); "
                   f"for this run use tvq codebook, tvq eval, tvq export, tvq sample\n")
