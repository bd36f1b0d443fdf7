"""`tvq classify train | eval` through the command line: a tiny run on digits, its evaluation (text, JSON keys,
the confusion-matrix PNG), resuming it, and the one-line errors of bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from transformer_vq.cli import main
from transformer_vq.train.checkpoint import latest_checkpoint

pytest.importorskip("sklearn")


def tiny(run_dir, *extra: str) -> list[str]:
    return ["classify", "train", "--preset", "tiny", "--data", "digits", "--run-dir", str(run_dir), "--steps", "4",
            "--batch-size", "8", "--eval-every", "2", "--device", "cpu", "--log-every", "1000", *extra]


def run_cli(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return code, out.out, out.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("classify") / "run"
    assert main(tiny(run_dir)) == 0
    return run_dir


def test_train_writes_the_run(trained):
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval" not in r] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r.get("eval") == "validation"] == [2, 4]
    assert {"loss", "accuracy", "lr", "grad_norm", "tokens"} <= set(records[0])
    saved = json.loads((trained / "config.json").read_text())
    assert (saved["model"]["n_classes"], saved["model"]["vocab_size"], saved["model"]["causal"]) == (10, 17, False)
    assert list((trained / "checkpoints").glob("step_*")) and list((trained / "best").glob("step_*"))
    assert list((trained / "tb").iterdir())


def test_eval_json_and_png(capsys, trained, tmp_path):
    plot = tmp_path / "cm.png"
    code, out, _ = run_cli(capsys, ["classify", "eval", "--ckpt", str(trained), "--split", "validation", "--json",
                                    "--plot", str(plot), "--device", "cpu"])
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"ckpt", "split", "step", "loss", "accuracy", "examples", "per_class_accuracy",
                           "confusion", "class_names", "plot", "seconds"}
    assert (result["split"], result["step"], result["examples"], result["plot"]) == ("validation", 4, 180, str(plot))
    confusion = result["confusion"]
    assert sum(map(sum, confusion)) == 180
    assert result["accuracy"] == sum(confusion[i][i] for i in range(10)) / 180
    assert result["per_class_accuracy"] == [row[i] / sum(row) if sum(row) else None for i, row in enumerate(confusion)]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    last = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()][-1]
    assert (last["accuracy"], last["loss"]) == (result["accuracy"], pytest.approx(result["loss"], abs=1e-6))


def test_eval_text_of_the_best_checkpoint(capsys, trained):
    code, out, _ = run_cli(capsys, ["classify", "eval", "--ckpt", str(trained / "best"), "--device", "cpu"])
    assert code == 0
    best_step = latest_checkpoint(trained / "best").step
    lines = out.splitlines()
    assert lines[0].startswith(f"test (step {best_step}): accuracy ") and lines[0].endswith("over 360 examples")
    assert lines[1].startswith("per class: 0 ") and lines[2] == f"confusion matrix: {trained}/confusion_test.png"
    assert (trained / "confusion_test.png").is_file()


@pytest.mark.parametrize("given, written", [("plots", "plots/confusion_test.png"), ("cm", "cm")],
                         ids=["directory", "no-suffix"])
def test_the_plot_path_printed_is_the_one_written(capsys, trained, tmp_path, given, written):
    (tmp_path / "plots").mkdir()
    code, out, _ = run_cli(capsys, ["classify", "eval", "--ckpt", str(trained), "--plot", str(tmp_path / given),
                                    "--device", "cpu"])
    assert code == 0
    assert out.splitlines()[2] == f"confusion matrix: {tmp_path / written}"
    assert (tmp_path / written).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [Path(written).name]


def test_resume_continues_the_saved_config(capsys, trained, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    code, out, _ = run_cli(capsys, ["classify", "train", "--run-dir", str(run_dir), "--resume", "--steps", "6",
                                    "--device", "cpu"])
    assert code == 0 and "resumed from" in out and "done: 6 steps" in out


@pytest.mark.parametrize("extra, message", [
    (["--data", "nope"], "error: --data: must be one of listops, fashion-mnist, digits, cifar10, pathfinder, imdb, "
                         "aan, got 'nope'"),
    (["--arch", "nope"], "error: --arch: must be one of longvq, transformer, tvq, got 'nope'"),
    (["--batch-size", "5000"], "error: the split has 1257 examples, fewer than one batch of 5000; lower batch_size"),
    (["--data", "imdb"], "error: imdb is not fetched automatically; download aclImdb_v1.tar.gz from "
                         "https://ai.stanford.edu/~amaas/data/sentiment/ and pass it (or the unpacked aclImdb "
                         "directory) with --data-path"),
    (["--data-option", "nope=1"], "error: dataset 'digits' has no option 'nope'; its options are: seed, "
                                  "validation_size, test_size"),
    (["--steps", "0"], "error: --steps: must be a positive integer, got '0'"),
], ids=["data", "arch", "batch-size", "missing-files", "data-option", "steps"])
def test_bad_input(capsys, tmp_path, extra, message):
    code, _, err = run_cli(capsys, tiny(tmp_path / "run", *extra))
    assert (code, err) == (2, message + "\n")
    assert not (tmp_path / "run").exists()


def test_resume_with_another_arch(capsys, trained, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    code, _, err = run_cli(capsys, tiny(run_dir, "--resume", "--arch", "transformer", "--steps", "6"))
    assert (code, err) == (2, f"error: checkpoint {run_dir}/checkpoints/step_00000004 holds a longvq classifier and "
                              f"this run asks for --arch transformer; resume with --arch longvq, or start a new run "
                              f"with another --run-dir\n")


def test_resume_with_another_dataset_is_refused_before_it_is_made(capsys, trained, monkeypatch):
    """The kept fields are checked from the checkpoint's config before the dataset is loaded (ListOps' generator
    ran for minutes before the refusal)."""
    import transformer_vq.train.classify.build as build

    def never(*args, **kwargs):
        raise AssertionError("the dataset was loaded before the refusal")

    monkeypatch.setattr(build, "load_classify_data", never)
    code, _, err = run_cli(capsys, ["classify", "train", "--resume", "auto", "--run-dir", str(trained), "--data",
                                    "listops", "--steps", "6"])
    assert code == 2 and err.startswith(f"error: --data: the run in {trained}/checkpoints/step_00000004 was trained "
                                        f"with data 'digits' and this run asks for 'listops'")


def test_fresh_run_over_checkpoints_and_eval_of_nothing(capsys, trained, tmp_path):
    code, _, err = run_cli(capsys, tiny(trained))
    assert (code, err) == (2, f"error: run directory {trained} already holds checkpoints; continue that run with "
                              f"--resume auto, or start a new one with another --run-dir (or --name)\n")
    code, _, err = run_cli(capsys, ["classify", "eval", "--ckpt", str(tmp_path / "none")])
    assert (code, err) == (2, f"error: checkpoint path {tmp_path}/none does not exist; pass a run directory (e.g. "
                              f"runs/default) or one of its checkpoints/step_* directories\n")


def test_eval_threads_are_applied(capsys, trained, monkeypatch):
    """`tvq classify eval --threads N` sets PyTorch's CPU threads, as `tvq classify train --threads` does."""
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    code, _, _ = run_cli(capsys, ["classify", "eval", "--ckpt", str(trained), "--threads", "1", "--device", "cpu"])
    assert code == 0 and asked == [1]


def test_a_plot_named_other_than_png_is_refused(capsys, trained, tmp_path):
    """The figure is PNG: a .jpg name held PNG bytes, silently; refused before the evaluation runs."""
    code, _, err = run_cli(capsys, ["classify", "eval", "--ckpt", str(trained), "--plot", str(tmp_path / "cm.jpg")])
    assert (code, err) == (2, f"error: --plot: figures are written as PNG, and '{tmp_path / 'cm.jpg'}' names a .jpg "
                              f"file: name it .png (or a directory)\n")
    assert not (tmp_path / "cm.jpg").exists()


def test_a_best_checkpoint_is_not_resumed_from_and_says_where_to_resume(capsys, trained, tmp_path):
    """A best/ checkpoint holds the weights only: a resume from it is refused with the run's checkpoints to resume
    from (it was taken for a run directory and refused for flags never given, then failed on a KeyError)."""
    fork = tmp_path / "run"
    shutil.copytree(trained, fork)
    best = next((fork / "best").glob("step_*"))
    code, _, err = run_cli(capsys, ["classify", "train", "--resume", str(best), "--steps", "9", "--eval-every", "0",
                                    "--device", "cpu"])
    assert code == 2 and f"error: --resume: checkpoint {best} holds the model's weights only" in err
    assert f"resume from the run's checkpoints/ (--resume {fork})" in err
