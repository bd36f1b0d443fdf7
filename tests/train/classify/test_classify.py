"""Classification training (`classify_train`): a run stopped by SIGTERM and resumed with --resume auto ends with the
bitwise weights and the step losses of an uninterrupted run (dropout on, so the RNG states matter; negative control:
not restoring the data position changes them); evaluation agrees with a one-example-at-a-time reference on
variable-length ListOps; the best validation is kept."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from trainutil import read_metrics
from transformer_vq.config import ConfigError, classify_config
from transformer_vq.data.classify import load_classification
from transformer_vq.train.checkpoint import BEST_DIR, latest_checkpoint
from transformer_vq.train.classify import ClassifyTrainer, classify_train
from transformer_vq.train.classify.build import build_classifier
from transformer_vq.train.classify.evaluate import evaluate_examples

pytest.importorskip("sklearn")
STEPS = 12
TRAIN = dict(data="digits", steps=STEPS, batch_size=8, eval_every=4, ckpt_every=5, eval_batch_size=64,
             warmup_steps=3, lr=3e-3, device="cpu", log_every=1000)


@pytest.fixture(scope="module")
def digits():
    return load_classification("digits")


def config(data, run_dir, **train):
    return classify_config(n_classes=data.n_classes, vocab_size=data.vocab_size, preset="tiny",
                           model={"dropout": 0.1}, train={**TRAIN, "run_dir": str(run_dir), **train})


def weights(run_dir):
    return load_file(str(latest_checkpoint(run_dir / "checkpoints").path / "model.safetensors"))


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def reference(digits, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = classify_train(config(digits, run_dir), data=digits)
    assert result.exit_code == 0 and result.step == STEPS
    return run_dir, result


def sigterm_at(monkeypatch, step: int) -> None:
    """Make the training process receive SIGTERM during step ``step`` (handled after it, as a real signal)."""
    original = ClassifyTrainer.train_step

    def train_step(self):
        if self.step + 1 == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(ClassifyTrainer, "train_step", train_step)


def interrupted(digits, run_dir, monkeypatch, skip=frozenset()):
    with monkeypatch.context() as patch:
        sigterm_at(patch, 7)
        stopped = classify_train(config(digits, run_dir), data=digits)
    assert (stopped.exit_code, stopped.step) == (143, 7)
    assert latest_checkpoint(run_dir / "checkpoints").step == 7
    return classify_train(config(digits, run_dir), resume="auto", data=digits, _skip_restore=skip)


def test_sigterm_then_resume_is_bitwise_identical(digits, reference, tmp_path, monkeypatch):
    ref_dir, ref = reference
    resumed = interrupted(digits, tmp_path / "run", monkeypatch)
    assert resumed.exit_code == 0
    assert losses(tmp_path / "run") == losses(ref_dir)
    got, want = weights(tmp_path / "run"), weights(ref_dir)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert resumed.best == ref.best and resumed.validation.to_dict() | {"seconds": 0} == \
        ref.validation.to_dict() | {"seconds": 0}


def test_resume_without_the_data_position_differs(digits, reference, tmp_path, monkeypatch):
    interrupted(digits, tmp_path / "run", monkeypatch, skip=frozenset({"data"}))
    assert losses(tmp_path / "run")[8] != losses(reference[0])[8]


def test_best_validation_is_kept(digits, reference):
    run_dir, result = reference
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("eval") == "validation"]
    assert [r["step"] for r in evals] == [4, 8, 12]
    best = max(evals, key=lambda r: (r["accuracy"], -r["loss"]))
    assert result.best == {k: best[k] for k in ("step", "loss", "accuracy", "examples")}
    saved = latest_checkpoint(run_dir / BEST_DIR)
    assert saved.step == best["step"] and saved.state["validation"] == result.best


def test_evaluation_equals_one_example_at_a_time(tmp_path):
    data = load_classification("listops", n_train=48, n_validation=16, n_test=16, min_length=10, max_length=80,
                               max_depth=3, cache_dir=tmp_path)
    examples = data.split("validation")
    assert len(set(examples.lengths.tolist())) > 1  # batches are padded
    cfg = classify_config(n_classes=data.n_classes, vocab_size=data.vocab_size, preset="tiny",
                          train={"data": "listops", "device": "cpu"})
    torch.manual_seed(0)
    model = build_classifier(cfg).double().eval()
    result = evaluate_examples(model, examples, n_classes=data.n_classes, batch_size=5)
    confusion, loss = torch.zeros(10, 10, dtype=torch.long), 0.0
    for i in range(len(examples)):
        ids, label = examples[i]
        logits = model(torch.tensor(ids, dtype=torch.long)[None]).logits[0]
        loss += F.cross_entropy(logits, torch.tensor(label)).item()
        confusion[label, logits.argmax()] += 1
    assert result.confusion == confusion.tolist()
    assert result.loss == pytest.approx(loss / len(examples), abs=1e-10)
    assert result.accuracy == confusion.trace().item() / len(examples)


def test_validation_takes_batch_norm_statistics_from_the_current_weights(digits, tmp_path):
    """A batch-normed classifier is validated (and saved) with statistics re-estimated from the first training
    examples under its weights as they are, not its lagging running averages (transformer_vq/nn/batch_stats.py)."""
    from transformer_vq.data.classify import ordered_batches
    from transformer_vq.nn.batch_stats import batch_norms, recompute_batch_norm_stats
    from transformer_vq.train.classify.evaluate import BATCH_NORM_EXAMPLES

    cfg = classify_config(n_classes=digits.n_classes, vocab_size=digits.vocab_size, preset="tiny",
                          model={"norm": "batch", "dropout": 0.0},
                          train={**TRAIN, "steps": 4, "eval_every": 4, "lr": 1e-2, "run_dir": str(tmp_path / "run")})
    assert classify_train(cfg, data=digits).exit_code == 0
    saved = build_classifier(cfg)
    latest_checkpoint(tmp_path / "run" / "checkpoints").load_weights(saved)  # step 4: validated, then saved
    fresh = build_classifier(cfg)
    latest_checkpoint(tmp_path / "run" / "checkpoints").load_weights(fresh)
    train = digits.split("train")
    used = recompute_batch_norm_stats(fresh, ((ids, mask) for ids, mask, _ in ordered_batches(
        train.window(0, BATCH_NORM_EXAMPLES), cfg.train.batch_size, pad_id=digits.pad_id)))
    assert used == BATCH_NORM_EXAMPLES // cfg.train.batch_size
    for mine, theirs in zip(batch_norms(saved), batch_norms(fresh)):
        torch.testing.assert_close(mine.running_mean, theirs.running_mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(mine.running_var, theirs.running_var, rtol=0, atol=1e-6)


def test_eval_scores_a_checkpoint_with_lagging_statistics_as_validation_did(digits, tmp_path):
    """`tvq classify eval` re-estimates a batch-normed model's statistics as validation does: a checkpoint whose
    running averages are off (a periodic save between validations, or one written before validation re-estimated
    them) scores what the same weights scored in validation. Control: scored as saved, it scores otherwise."""
    from transformer_vq.nn.batch_stats import batch_norms
    from transformer_vq.train.checkpoint.store import save_checkpoint
    from transformer_vq.train.classify import classify_eval

    run_dir = tmp_path / "run"
    cfg = classify_config(n_classes=digits.n_classes, vocab_size=digits.vocab_size, preset="tiny",
                          model={"norm": "batch", "dropout": 0.0},
                          train={**TRAIN, "steps": 4, "eval_every": 4, "lr": 1e-2, "run_dir": str(run_dir)})
    assert classify_train(cfg, data=digits).exit_code == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in records if r.get("eval") == "validation"][-1]
    model = build_classifier(cfg)
    latest_checkpoint(run_dir / "checkpoints").load_weights(model)  # step 4: validated, then saved
    norms = batch_norms(model)
    assert norms
    with torch.no_grad():
        for norm in norms:  # lagging averages, exaggerated
            norm.running_mean.mul_(3.0).add_(1.0)
            norm.running_var.mul_(3.0)
    lagging = save_checkpoint(tmp_path / "lagging", step=4, model=model, config=cfg.to_dict(), state={}, keep=1)
    scored = classify_eval(str(lagging), split="validation", device="cpu")
    assert scored.accuracy == pytest.approx(validated["accuracy"], abs=1e-12)
    assert scored.loss == pytest.approx(validated["loss"], rel=1e-5)
    as_saved = evaluate_examples(model, digits.split("validation"), n_classes=digits.n_classes, batch_size=64)
    assert as_saved.loss != pytest.approx(scored.loss, rel=1e-3)


@pytest.mark.parametrize("loaded, named", [
    (("listops", dict(n_train=20, n_validation=4, n_test=4, min_length=5, max_length=30)),
     "the dataset given is 'listops' and the config names 'digits'"),
    (("digits", dict(seed=5, test_size=100)),
     "the dataset given is 'digits' with seed 5, test_size 100 and the config names 'digits' with seed 0, test_size "
     "360"),
], ids=["another-dataset", "other-options"])
def test_a_dataset_other_than_the_configs_is_refused(tmp_path, loaded, named):
    """The run records cfg.train's dataset and evaluates and resumes on it: training on another (here with the same
    classes, and a vocabulary the model covers) would make its config.json false."""
    name, options = loaded
    data = load_classification(name, **options)
    cfg = classify_config(n_classes=10, vocab_size=20, preset="tiny", train={**TRAIN, "run_dir": str(tmp_path / "r")})
    with pytest.raises(ConfigError) as err:
        classify_train(cfg, data=data)
    assert str(err.value) == (f"data: {named}; a run records its config's dataset, and evaluates and resumes on it: "
                              f"pass the dataset that load_classify_data(cfg.train) loads (or none), or set "
                              f"cfg.train's data, data_path and data_options to the dataset's")
    assert not (tmp_path / "r").exists()
    # the same options written as the command line gives them (text) name the same data
    same = classify_config(n_classes=10, vocab_size=20, preset="tiny", train={
        **TRAIN, "data": name, "data_options": {k: str(v) for k, v in options.items()}, "steps": 1, "eval_every": 0,
        "run_dir": str(tmp_path / "r")})
    assert classify_train(same, data=data).exit_code == 0


def listops_release(folder, seed: int):
    """A small ListOps release (LRA's basic_{train,val,test}.tsv) of 24 + 8 + 8 expressions drawn with ``seed``."""
    from transformer_vq.data.classify import listops

    folder.mkdir()
    for name, n in (("basic_train.tsv", 24), ("basic_val.tsv", 8), ("basic_test.tsv", 8)):
        expressions = listops.generate(n, seed=seed, max_depth=3, min_length=5, max_length=40)
        seed += 1
        rows = [f"{listops.decode(e)}\t{label}" for e, label in zip(expressions, listops.labelled(expressions))]
        (folder / name).write_text("Source\tTarget\n" + "\n".join(rows) + "\n")
    return folder


def listops_run(data_path, run_dir, steps: int):
    return classify_config(n_classes=10, vocab_size=20, preset="tiny", train={
        **TRAIN, "data": "listops", "data_path": str(data_path), "steps": steps, "batch_size": 4, "eval_every": 2,
        "ckpt_every": 2, "run_dir": str(run_dir)})


@pytest.fixture
def releases(tmp_path, monkeypatch):
    """Two ListOps releases of the same sizes, the first also copied elsewhere (moved), and a run dir."""
    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path / "cache"))
    first = listops_release(tmp_path / "first", seed=1)
    moved = tmp_path / "elsewhere" / "first"
    shutil.copytree(first, moved)
    return first, listops_release(tmp_path / "other", seed=11), moved, tmp_path / "run"


def test_a_resume_on_another_dataset_is_refused_and_a_moved_one_is_the_same(releases):
    """The checkpoint records its dataset (name, split sizes, a hash of every label and length and of sampled
    examples): a resume on another release (here of the same sizes; it went on training on it and compared its
    validation with the best of the first's) is refused, naming both, before anything is written; the same release
    moved elsewhere resumes (as a language model's corpus does: tests/train/test_resume_fields.py)."""
    first, other, moved, run_dir = releases
    assert classify_train(listops_run(first, run_dir, 2)).exit_code == 0
    saved = latest_checkpoint(run_dir / "checkpoints").state["dataset"]
    assert set(saved) == {"name", "examples", "sample_sha256", "data_path", "generated"} and not saved["generated"]
    assert saved["examples"] == {"train": 24, "validation": 8, "test": 8}
    config = (run_dir / "config.json").read_text()
    with pytest.raises(ConfigError) as err:
        classify_train(listops_run(other, run_dir, 4), resume="auto")
    assert str(err.value) == (f"--data-path: the run in {run_dir} was trained on the listops dataset of 24 training "
                              f"examples read from {first} and this run reads the listops dataset of 24 training "
                              f"examples read from {other}, which differs: a resumed run continues on its own dataset "
                              f"(moved elsewhere, it is recognized by its examples); resume with it, or start a new "
                              f"run (--run-dir)")
    assert (run_dir / "config.json").read_text() == config and latest_checkpoint(run_dir / "checkpoints").step == 2
    resumed = classify_train(listops_run(moved, run_dir, 4), resume="auto")
    assert (resumed.exit_code, resumed.step) == (0, 4)
    assert latest_checkpoint(run_dir / "checkpoints").state["dataset"]["data_path"] == str(moved)


def test_a_checkpoint_saved_without_its_datasets_identity_resumes(releases, monkeypatch):
    """A checkpoint of before the dataset's identity was saved has nothing to compare: it resumes, as it did."""
    first, other, _, run_dir = releases
    saving = ClassifyTrainer.checkpoint_state
    with monkeypatch.context() as patch:
        patch.setattr(ClassifyTrainer, "checkpoint_state",
                      lambda self: {k: v for k, v in saving(self).items() if k != "dataset"})
        assert classify_train(listops_run(first, run_dir, 2)).exit_code == 0
    assert "dataset" not in latest_checkpoint(run_dir / "checkpoints").state
    assert classify_train(listops_run(other, run_dir, 4), resume="auto").exit_code == 0


def test_eval_on_another_dataset_is_refused_and_on_the_same_one_moved_is_not(releases, capsys):
    """`tvq classify eval --data-path` compares the dataset it reads with the checkpoint's record (the latest's and
    best/'s), by resume's check: another release of the same sizes (scored in silence, batch norm's statistics taken
    from its train split) is refused in one line naming both; the same release moved elsewhere scores the same."""
    from transformer_vq.cli import main
    from transformer_vq.train.classify import classify_eval

    first, other, moved, run_dir = releases
    assert classify_train(listops_run(first, run_dir, 2)).exit_code == 0
    for ckpt in (run_dir, run_dir / BEST_DIR):
        own = classify_eval(str(ckpt), device="cpu", plot=str(run_dir / "cm.png"))
        elsewhere = classify_eval(str(ckpt), device="cpu", plot=str(run_dir / "cm.png"), data_path=str(moved))
        assert (elsewhere.loss, elsewhere.confusion) == (own.loss, own.confusion)
        with pytest.raises(ConfigError) as err:
            classify_eval(str(ckpt), device="cpu", data_path=str(other))
        assert str(err.value) == (
            f"--data-path: the run in {run_dir} was trained on the listops dataset of 24 training examples read from "
            f"{first} and --data-path holds the listops dataset of 24 training examples read from {other}, "
            f"which differs: eval scores a run on its own dataset (moved elsewhere, it is recognized by its "
            f"examples); pass where that dataset is now, or leave --data-path out")
    capsys.readouterr()
    assert main(["classify", "eval", "--ckpt", str(run_dir), "--data-path", str(other)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.endswith(f"error: {err.value}\n") and out.err.count("error") == 1, out.err


def test_eval_of_a_run_that_generated_its_data_refuses_a_data_path(releases, capsys):
    """A run whose examples were generated (no --data-path in training) refuses `classify eval --data-path` up front,
    saying so: a path names a release, other examples, and the loader refused the run's generation options as if
    eval (which has no --data-option) had been given them."""
    from transformer_vq.cli import main
    from transformer_vq.train.classify import classify_eval

    first, _, _, run_dir = releases
    generated = classify_config(n_classes=10, vocab_size=20, preset="tiny", train={
        **TRAIN, "data": "listops", "steps": 2, "batch_size": 4, "eval_every": 0, "run_dir": str(run_dir),
        "data_options": {"n_train": 16, "n_validation": 4, "n_test": 4, "max_depth": 3, "min_length": 5,
                         "max_length": 40}})
    assert classify_train(generated).exit_code == 0
    assert latest_checkpoint(run_dir / "checkpoints").state["dataset"]["generated"]
    for path in (run_dir, first):
        with pytest.raises(ConfigError) as err:
            classify_eval(str(run_dir), device="cpu", data_path=str(path))
        assert str(err.value) == (f"--data-path: the run in {run_dir} generated its listops data (it was trained "
                                  f"without --data-path), and {path} would be read as a release, other examples; "
                                  f"leave --data-path out to score the run on its own data")
    capsys.readouterr()
    assert main(["classify", "eval", "--ckpt", str(run_dir), "--data-path", str(first)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"error: {err.value}\n", out.err  # one line, before any data is read
