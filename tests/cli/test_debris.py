"""Crash debris: what a killed save or prune leaves behind is never taken for a checkpoint, and the next
training on the run removes it; pruning renames a checkpoint away before deleting it."""

from __future__ import annotations

import shutil

import pytest

from cliutil import run_cli, tiny_train


def resume(capsys, corpus, run_dir, steps: int) -> None:
    code, err = run_cli(capsys, tiny_train(corpus, run_dir, "--resume", "--steps", str(steps)))
    assert code == 0, err


@pytest.mark.parametrize("debris", [".step_00000004.k3j9x1.tmp", ".step_00000004.tmp-4242",
                                    ".trash-step_00000004-77"], ids=["killed-save", "killed-save-old-name",
                                                                      "killed-prune"])
def test_debris_is_cleaned_and_never_resumed_from(capsys, corpus, finished_run, debris):
    root = finished_run / "checkpoints"
    shutil.copytree(root / "step_00000002", root / debris)  # looks complete, but under a temporary name
    resume(capsys, corpus, finished_run, 3)  # from step 2: a resume from the debris would be refused (step 4)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000002", "step_00000003"]


def test_prune_killed_midway_leaves_no_half_checkpoint(capsys, corpus, finished_run, monkeypatch):
    """Ctrl-C while the oldest checkpoint is deleted: exit 130, the checkpoint is already out of the step_* names."""
    root = finished_run / "checkpoints"
    original = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        if ".trash-" in str(path):
            for item in sorted(p for p in path.iterdir())[:1]:
                item.unlink()  # half deleted when the interrupt lands
            raise KeyboardInterrupt
        return original(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    code, err = run_cli(capsys, tiny_train(corpus, finished_run, "--resume", "--steps", "3", "--keep-ckpts", "1"))
    assert (code, err.splitlines()[-1]) == (130, "interrupted"), err
    monkeypatch.undo()
    names = sorted(p.name for p in root.iterdir())
    assert names[:2] == [".trash-step_00000002-" + names[0].rsplit("-", 1)[1], "latest"], names
    assert names[2:] == ["step_00000003"]
    resume(capsys, corpus, finished_run, 4)  # the resumed run keeps its --keep-ckpts 1 (its saved training field)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000004"]
