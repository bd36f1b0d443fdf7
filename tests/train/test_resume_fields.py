"""What flags given with ``--resume`` do to the run they continue: the fields a resumed run must keep are refused
before anything is loaded or written (a change of optimizer once crashed mid-step and left a config.json that broke
every later resume), and the learning rate and weight decay, which the checkpoint's optimizer and scheduler used to
bring back silently, take effect."""

from __future__ import annotations

import json
import shutil

import pytest
from trainutil import read_metrics, tiny_config
from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.train import train
from transformer_vq.train.checkpoint import latest_checkpoint, read_checkpoint
from transformer_vq.train.lm import LMTrainer


@pytest.fixture(scope="module")
def two_steps(corpus_file, tmp_path_factory):
    """A run of 2 steps of 2 windows each: its checkpoint falls at a batch boundary (step 2)."""
    run_dir = tmp_path_factory.mktemp("resume-fields") / "run"
    assert train(tiny_config(corpus_file, run_dir, "steps=2")).exit_code == 0
    return run_dir


@pytest.mark.parametrize("field, value, saved", [("optimizer", "adafactor", "'adamw'"),
                                                 ("update_len", "32", "16"), ("batch_size", "2", "4")])
def test_fields_a_resumed_run_keeps_are_refused_before_anything_is_written(corpus_file, two_steps, field, value,
                                                                            saved):
    config = (two_steps / "config.json").read_text()
    overrides = ("steps=4", f"{field}={value}", *(("lr=none",) if field == "optimizer" else ()))
    with pytest.raises(ConfigError, match=rf"^--{field.replace('_', '-')}: the run in .* was trained with {field} "
                                          rf"{saved} and this run asks for .*{value}"):
        train(tiny_config(corpus_file, two_steps, *overrides), resume="auto")
    assert (two_steps / "config.json").read_text() == config


def test_learning_rate_and_weight_decay_given_with_resume_take_effect(corpus_file, two_steps, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copytree(two_steps, run_dir, dirs_exist_ok=True)  # a copy: the fixture's run stays at step 2
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["run_dir"] = str(run_dir)
    (run_dir / "config.json").write_text(json.dumps(config))
    assert train(tiny_config(corpus_file, run_dir, "steps=3", "lr=1e-4", "weight_decay=0.5"),
                 resume="auto").exit_code == 0
    step3 = next(r for r in read_metrics(run_dir) if r.get("step") == 3 and "lr" in r)
    warmup = config["train"]["warmup_steps"]
    assert step3["lr"] == pytest.approx(1e-4 * 3 / warmup, rel=1e-12)  # the schedule of the new peak, at step 3
    groups = latest_checkpoint(run_dir / "checkpoints").state["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0] and groups[0]["initial_lr"] == 1e-4


def test_resume_path_continues_the_run_it_names(two_steps, tmp_path, monkeypatch, capsys):
    """``--resume PATH`` starts from the config of the run PATH names and writes into it: it used to read the
    default run directory's config (a misleading --seq-len refusal) or continue the other run inside it."""
    run_dir = tmp_path / "moved"
    shutil.copytree(two_steps, run_dir)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run_dir / "checkpoints" / "step_00000002"), "--steps", "3"]) == 0
    assert latest_checkpoint(run_dir / "checkpoints").step == 3 and not (tmp_path / "runs").exists()
    other = tmp_path / "other"
    shutil.copytree(two_steps, other)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--run-dir", str(other), "--steps", "4"]) == 2
    assert "already holds checkpoints of another run" in capsys.readouterr().err
    assert latest_checkpoint(other / "checkpoints").step == 2


def test_resume_path_into_another_run_dir_forks_it(two_steps, tmp_path, monkeypatch):
    """``--resume PATH --run-dir NEW``: PATH's config (not NEW's, empty: the defaults, a false --seq-len refusal),
    continued in NEW; PATH's run untouched."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(two_steps), "--run-dir", str(tmp_path / "fork"), "--steps", "3"]) == 0
    assert latest_checkpoint(tmp_path / "fork" / "checkpoints").step == 3
    assert latest_checkpoint(two_steps / "checkpoints").step == 2


def test_a_checkpoint_named_is_judged_as_itself_not_as_the_runs_latest(corpus_file, tmp_path, monkeypatch):
    """Rewinding to an earlier checkpoint (before a divergence, say) and training it to a shorter horizon: the step
    the resume starts from is the named checkpoint's, not the step ``latest`` names (once refused as "already at
    step 3")."""
    run_dir = tmp_path / "run"
    assert train(tiny_config(corpus_file, run_dir, "steps=3", "ckpt_every=1")).exit_code == 0
    monkeypatch.chdir(tmp_path)
    first = run_dir / "checkpoints" / "step_00000001"
    assert main(["train", "--resume", str(first), "--run-dir", str(tmp_path / "fork"), "--steps", "2"]) == 0
    assert latest_checkpoint(tmp_path / "fork" / "checkpoints").step == 2
    second = run_dir / "checkpoints" / "step_00000002"
    with pytest.raises(ConfigError, match=r"step_00000002 is already at step 2 and --steps is 1"):
        train(tiny_config(corpus_file, tmp_path / "fork1", "steps=1"), resume=str(second))


def test_a_rewind_forks_with_its_checkpoint_s_config_and_never_writes_a_second_history(corpus_file, tmp_path,
                                                                                         monkeypatch, capsys):
    """Training from an earlier checkpoint again in its own run directory is refused while later checkpoints are
    there (pruning and ``--resume auto`` go by step number: the new checkpoint was pruned at once and the next resume
    took the abandoned branch); a fork into a new directory starts from the named checkpoint's config, not from the
    config of the run's latest attempt (another lr, here); a name that does not exist is said to be missing."""
    monkeypatch.chdir(tmp_path)
    assert train(tiny_config(corpus_file, tmp_path / "run", "steps=2", "ckpt_every=1")).exit_code == 0
    assert main(["train", "--resume", "run", "--steps", "3", "--lr", "1e-5"]) == 0  # a later attempt
    first = "run/checkpoints/step_00000001"
    assert main(["train", "--resume", first, "--steps", "2"]) == 2
    assert "run holds checkpoints after step 1 (step_00000002, step_00000003), and training from step 1 again " \
           "there would mix two histories; continue in a new directory (--run-dir NEW)" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")] != [] and \
        latest_checkpoint(tmp_path / "run" / "checkpoints").step == 3
    assert main(["train", "--resume", first, "--run-dir", "fork", "--steps", "2"]) == 0
    lr = [json.loads((tmp_path / d / "config.json").read_text())["train"]["lr"] for d in ("fork", first)]
    assert lr[0] == lr[1] != 1e-5
    assert main(["train", "--resume", "run/checkpoints/step_00000009", "--steps", "5"]) == 2
    assert "--resume: checkpoint path run/checkpoints/step_00000009 does not exist" in capsys.readouterr().err


def test_a_checkpoint_reached_by_a_link_or_a_copy_is_resumed_into_its_run_never_written_into(corpus_file, tmp_path,
                                                                                             monkeypatch):
    """A run resumed from a checkpoint named by a link (or a copy under another name) writes into the run holding
    it, or the copy's directory: taken for the run directory, the checkpoint was written into, and its files no
    longer matched their checksums."""
    monkeypatch.chdir(tmp_path)
    assert train(tiny_config(corpus_file, tmp_path / "run", "steps=2", "ckpt_every=1")).exit_code == 0
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    before = sorted(p.name for p in step.iterdir())
    (tmp_path / "good").symlink_to(step)
    assert main(["train", "--resume", "good", "--steps", "3"]) == 0
    assert sorted(p.name for p in step.iterdir()) == before
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").step == 3
    latest_checkpoint(tmp_path / "run" / "checkpoints")  # every checkpoint verifies (raises otherwise)
    assert read_checkpoint(step).step == 2


def test_resume_auto_takes_the_run_dir_a_config_file_names(two_steps, corpus_file, tmp_path, monkeypatch):
    """The run directory named in ``--config`` is the one whose saved config a resume continues: not the default
    run directory's (whose settings, another lr here, were silently written into the resumed run)."""
    monkeypatch.chdir(tmp_path)
    assert train(tiny_config(corpus_file, tmp_path / "runs" / "default", "steps=1", "lr=5e-3")).exit_code == 0
    run_dir = tmp_path / "mine"
    shutil.copytree(two_steps, run_dir)
    (tmp_path / "cf.yaml").write_text(f"train: {{run_dir: {run_dir}, steps: 3}}\n")
    assert main(["train", "--resume", "auto", "--config", str(tmp_path / "cf.yaml")]) == 0
    saved = json.loads((run_dir / "config.json").read_text())["train"]
    assert saved["lr"] == json.loads((two_steps / "config.json").read_text())["train"]["lr"] != 5e-3


def test_a_resume_that_fails_before_its_first_checkpoint_leaves_the_runs_config(corpus_file, two_steps, tmp_path,
                                                                                 monkeypatch):
    """The run's config.json is what the next ``--resume auto`` starts from: an attempt with other flags that fails
    before saving anything leaves it as it was (it was rewritten at the start, so the next resume inherited the failed
    attempt's flags); the resume that saves a checkpoint records its own."""
    run_dir = tmp_path / "run"
    shutil.copytree(two_steps, run_dir)
    config = (run_dir / "config.json").read_text()

    def first_step_fails(self):
        raise RuntimeError("the first step failed")

    with monkeypatch.context() as patch:
        patch.setattr(LMTrainer, "train_step", first_step_fails)
        with pytest.raises(RuntimeError, match="the first step failed"):
            train(tiny_config(corpus_file, run_dir, "steps=4", "lr=1e-4"), resume="auto")
    assert (run_dir / "config.json").read_text() == config
    assert train(tiny_config(corpus_file, run_dir, "steps=4", "lr=1e-4"), resume="auto").exit_code == 0
    assert json.loads((run_dir / "config.json").read_text())["train"]["lr"] == 1e-4


def test_a_resume_on_another_corpus_is_refused_and_a_moved_one_is_the_same(corpus_file, two_steps, tmp_path):
    """The checkpoint records its corpus (name, split lengths, a hash of sampled tokens): resuming on another file
    (here of the same length, which nothing noticed before) is refused before anything is written; the same file
    moved to another path resumes."""
    run_dir, other, moved = tmp_path / "run", tmp_path / "other.txt", tmp_path / "moved.txt"
    shutil.copytree(two_steps, run_dir)
    text = corpus_file.read_bytes()
    other.write_bytes(text[::-1])
    shutil.copy(corpus_file, moved)
    config = (run_dir / "config.json").read_text()
    with pytest.raises(ConfigError, match=rf"^--data-path: the run in {run_dir} was trained on the text corpus of "
                                          rf"[0-9,]+ training tokens read from {corpus_file} and this run reads the "
                                          rf"text corpus of [0-9,]+ training tokens read from {other}, which differs"):
        train(tiny_config(corpus_file, run_dir, "steps=4", f"data_path={other}"), resume="auto")
    assert (run_dir / "config.json").read_text() == config
    assert train(tiny_config(corpus_file, run_dir, "steps=4", f"data_path={moved}"), resume="auto").exit_code == 0


def test_a_mid_batch_checkpoint_resumed_in_another_precision_drops_its_carry(corpus_file, tmp_path, capsys):
    """The state carried into the rest of a batch holds tensors of the precision it was computed in: resumed under
    another ``--precision`` it is dropped with a warning, as under another split of the batch (it crashed the first
    step, naming the operator's dtypes and not the resume)."""
    run_dir = tmp_path / "run"
    assert train(tiny_config(corpus_file, run_dir, "steps=1", "precision=bfloat16")).exit_code == 0  # window 1 of 2
    capsys.readouterr()
    assert train(tiny_config(corpus_file, run_dir, "steps=2", "precision=float32"), resume="auto").exit_code == 0
    assert ("the checkpoint falls mid-batch and its carried states were computed in bfloat16; this run computes in "
            "float32: the rest of this batch starts without context") in capsys.readouterr().out


def test_the_data_options_a_refusal_gives_back_parse_as_saved():
    """The flags a refusal advises, pasted into a shell, give the saved options back: a list printed with spaces
    split into other arguments, and a glob was expanded by the shell."""
    import shlex

    from transformer_vq.config import parse_data_options
    from transformer_vq.train.checkpoint.resume import _flags_of

    saved = {"fractions": [0.8, 0.1, 0.1], "glob": "f*.txt", "lines": True, "limit": None, "name": "a b"}
    words = shlex.split(_flags_of("--data-option", saved))
    assert words[::2] == ["--data-option"] * len(saved)
    assert parse_data_options(words[1::2]) == saved
