"""Checkpoints: complete round trip, keep-last-K, fallback past a damaged one, architecture
mismatch, and a pickle with a code payload that must not run."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from trainutil import tiny_config
from transformer_vq import TransformerVQ
from transformer_vq.cli import main
from transformer_vq.train import CheckpointError, train
from transformer_vq.train.checkpoint import (find_checkpoint, latest_checkpoint, list_checkpoints, read_checkpoint,
                                             save_checkpoint)


def test_checkpoint_holds_everything(trained_run):
    ckpt = find_checkpoint(trained_run)
    assert ckpt.step == 6 and ckpt.path.name == "step_00000006"
    assert (trained_run / "checkpoints" / "latest").read_text() == "step_00000006\n"
    assert set(ckpt.state) == {"step", "optimizer", "scheduler", "data", "carry", "rng", "nonfinite_run",
                               "world_size", "validated_at", "corpus", "precision", "context_parallel"}
    assert ckpt.state["context_parallel"] == 1  # how the saved carries map to shares of the batch's rows
    assert set(ckpt.state["corpus"]) == {"name", "tokens", "sample_sha256", "documents_sha256", "data_path"}
    assert ckpt.state["validated_at"] == 6  # the end of the run validated before its save
    assert ckpt.state["data"]["index"] == 3  # 6 steps = 3 batches of 2 windows
    assert set(ckpt.state["rng"][0]) >= {"torch", "numpy", "python"}
    assert ckpt.config["model"]["d_model"] == 32 and ckpt.config["train"]["steps"] == 6
    model = TransformerVQ(tiny_config_model(ckpt))
    ckpt.load_weights(model)
    assert torch.count_nonzero(model.units[0].quantizer.ema_count) > 0  # codebook EMA restored


def tiny_config_model(ckpt):
    from transformer_vq.train import RunConfig

    return RunConfig.from_dict(ckpt.config).model


def test_keeps_last_k_and_ignores_unfinished(trained_run, tmp_path):
    root = tmp_path / "checkpoints"
    ckpt = find_checkpoint(trained_run)
    model = TransformerVQ(tiny_config_model(ckpt))
    for step in (1, 2, 3, 4):
        save_checkpoint(root, step=step, model=model, config=ckpt.config, state=ckpt.state, keep=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_00000003", "step_00000004"]
    # a save interrupted before its rename leaves only a hidden temporary directory
    (root / ".step_00000005.tmp-123").mkdir()
    assert latest_checkpoint(root).step == 4


@pytest.mark.parametrize("damage", ["truncate_weights", "corrupt_state", "no_manifest", "garbage_pointer",
                                    "lagging_pointer"])
def test_resume_falls_back_past_a_damaged_checkpoint(trained_run, tmp_path, damage, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    newest = run_dir / "checkpoints" / "step_00000006"
    if damage == "truncate_weights":
        weights = newest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        reason = (f"checkpoint {newest} is corrupted: model.safetensors does not match its checksum "
                  f"(truncated or modified after saving)")
    elif damage == "corrupt_state":
        state = newest / "state.pt"
        data = bytearray(state.read_bytes())
        data[100] ^= 0xFF
        state.write_bytes(bytes(data))
        reason = (f"checkpoint {newest} is corrupted: state.pt does not match its checksum "
                  f"(truncated or modified after saving)")
    elif damage == "no_manifest":
        (newest / "manifest.json").unlink()
        reason = f"{newest} is not a complete checkpoint (no manifest.json); it may have been interrupted while saving"
    elif damage == "garbage_pointer":
        (run_dir / "checkpoints" / "latest").write_bytes(b"\x00\xff garbage")
        reason = None
    else:  # a crash between step_6's rename and latest's update: step_6 is complete, and the newest
        (run_dir / "checkpoints" / "latest").write_text("step_00000003\n")
        reason = None
    found = latest_checkpoint(run_dir / "checkpoints")
    warning = capsys.readouterr().err
    if damage == "lagging_pointer":
        assert found.step == 6
        assert warning == (f"note: {run_dir / 'checkpoints' / 'latest'} names step_00000003, and step_00000006 is "
                           f"newer and complete (a save stopped before it updated latest): taking "
                           f"step_00000006\n")
    elif reason is None:  # a damaged pointer: the newest checkpoint that verifies is still found
        assert found.step == 6 and warning == ""
    else:
        assert found.step == 3
        assert warning == f"warning: skipping checkpoint: {reason}\n"

    # and training resumes from it, losing nothing that was saved intact (and refusing no later checkpoint as
    # another history: before, a lagging pointer's resume was refused so)
    result = train(tiny_config(find_corpus(trained_run), run_dir, "steps=8", "ckpt_every=3"), resume="auto")
    assert result.exit_code == 0 and result.step == 8


def find_corpus(run_dir):
    from transformer_vq.train import RunConfig

    return RunConfig.from_dict(read_checkpoint(list_checkpoints(run_dir / "checkpoints")[0]).config).train.data_path


def test_every_checkpoint_damaged_is_a_clear_error(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    for path in list_checkpoints(run_dir / "checkpoints"):
        (path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        latest_checkpoint(run_dir / "checkpoints", log=lambda msg: None)
    assert str(err.value) == (
        f"no complete checkpoint in {run_dir / 'checkpoints'}: every one failed verification (see warnings above); "
        f"start a new run with another --run-dir or without --resume"
    )
    # a reader of the run (eval, sample, codebook, export) is not told to use training's flags (helper-72 F2)
    with pytest.raises(CheckpointError) as err:
        find_checkpoint(run_dir)
    assert str(err.value).endswith("every one failed verification (see warnings above); pass --ckpt a run directory "
                                   "or a checkpoints/step_* directory whose checkpoint is intact")


def test_resume_with_another_architecture_is_refused(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    code = main(["train", "--resume", "auto", "--run-dir", str(run_dir), "--preset", "tiny",
                 "--set", "data=text", "--set", f"data_path={find_corpus(trained_run)}", "--set", "model.d_model=48",
                 "--set", "seq_len=32", "--set", "update_len=16", "--set", "batch_size=4", "--set", "steps=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: checkpoint {run_dir / 'checkpoints' / 'step_00000006'} is from a different architecture: "
        f"d_model=32 (checkpoint) vs 48 (this run). Use the same model settings as the checkpoint (its config.json), "
        f"or start a new run with another --run-dir"
    )
    assert "Traceback" not in err


def test_new_run_into_a_run_directory_is_refused(trained_run, capsys, monkeypatch):
    def no_corpus(*args, **kwargs):  # refused before the corpus is read (helper-74 audit-data F7: once after)
        raise AssertionError("the corpus was read before the run directory was refused")

    monkeypatch.setattr("transformer_vq.train.lm.trainer.load_corpus_for", no_corpus)
    code = main(["train", "--preset", "tiny", "--run-dir", str(trained_run), "--set", "data=text",
                 "--set", f"data_path={find_corpus(trained_run)}", "--set", "update_len=16"])
    assert code == 2
    assert (f"run directory {trained_run} already holds checkpoints; continue that run with --resume auto, or start "
            f"a new one with another --run-dir (or --name)") in capsys.readouterr().err


class Payload:
    """Unpickling this calls os.system: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_pickle_with_code_payload_is_refused_and_never_runs(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    ckpt_dir = run_dir / "checkpoints" / "step_00000006"
    marker = tmp_path / "pwned"
    torch.save({"step": 6, "optimizer": Payload(marker)}, ckpt_dir / "state.pt")  # saving runs nothing
    # make the manifest vouch for the malicious file, so loading really reaches the unpickler
    import hashlib
    import json

    manifest = json.loads((ckpt_dir / "manifest.json").read_text())
    manifest["state.pt"] = hashlib.sha256((ckpt_dir / "state.pt").read_bytes()).hexdigest()
    (ckpt_dir / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(CheckpointError) as err:
        read_checkpoint(ckpt_dir)
    assert str(err.value).startswith(
        f"refusing to load {ckpt_dir / 'state.pt'}: it contains Python objects other than tensors and plain data, "
        f"which could run code when unpickled"
    )
    assert str(err.value).endswith("Checkpoints written by transformer-vq never do; only load files from sources "
                                   "you trust")
    assert main(["eval", "--ckpt", str(ckpt_dir)]) == 2
    assert "error: refusing to load" in capsys.readouterr().err
    assert not marker.exists()
    # the payload is live: an unrestricted load (what the code above must never do) runs it
    torch.load(ckpt_dir / "state.pt", weights_only=False)
    assert marker.exists()


def test_debris_of_killed_saves_and_prunings_is_cleaned_on_resume(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    root = run_dir / "checkpoints"
    # a save killed before its rename (this version's and older versions' temporary names), and a
    # pruning killed after its rename: none of them is under a step_* name, so loading skips them
    debris = [root / ".step_00000009.x7_k2q.tmp", root / ".step_00000009.tmp-4242", root / ".trash-step_00000000-77"]
    for path in debris:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(root)] == ["step_00000003", "step_00000006"]
    assert latest_checkpoint(root).step == 6 and capsys.readouterr().err == ""
    result = train(tiny_config(find_corpus(trained_run), run_dir, "steps=7", "ckpt_every=3"), resume="auto")
    assert result.step == 7
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000003", "step_00000006", "step_00000007"]


def test_pruning_killed_midway_leaves_no_half_deleted_checkpoint(trained_run, tmp_path, monkeypatch):
    from transformer_vq import fileio

    root = tmp_path / "checkpoints"
    ckpt = find_checkpoint(trained_run)
    model = TransformerVQ(tiny_config_model(ckpt))
    for step in (1, 2):
        save_checkpoint(root, step=step, model=model, config=ckpt.config, state=ckpt.state, keep=2)
    original_rmtree = shutil.rmtree

    def killed_rmtree(path, ignore_errors=False):  # the process dies after deleting one file
        (path / "model.safetensors").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(root, step=3, model=model, config=ckpt.config, state=ckpt.state, keep=2)
    monkeypatch.setattr(fileio.shutil, "rmtree", original_rmtree)
    assert sorted(p.name for p in root.iterdir()) == [f".trash-step_00000001-{os.getpid()}", "latest",
                                                      "step_00000002", "step_00000003"]
    assert latest_checkpoint(root).step == 3
    for path in list_checkpoints(root):
        assert read_checkpoint(path).step == int(path.name[5:])  # every step_* verifies
    save_checkpoint(root, step=4, model=model, config=ckpt.config, state=ckpt.state, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000003", "step_00000004"]


def test_non_finite_weights_are_never_saved(trained_run, tmp_path):
    ckpt = find_checkpoint(trained_run)
    model = TransformerVQ(tiny_config_model(ckpt))
    ckpt.load_weights(model)
    with torch.no_grad():
        model.units[0].quantizer.ema_count[0] = float("nan")
    root = tmp_path / "checkpoints"
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(root, step=7, model=model, config=ckpt.config, state=ckpt.state, keep=2)
    assert str(err.value) == (
        "refusing to save checkpoint step_00000007: units.0.quantizer.ema_count hold NaN or infinity, and training "
        "could not resume from it; lower the learning rate, or resume from an earlier checkpoint"
    )
    assert not root.exists() or list(root.iterdir()) == []
