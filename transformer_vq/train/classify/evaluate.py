"""Evaluating a sequence classifier: accuracy, cross-entropy, per-class accuracy and the confusion matrix of a split,
and the confusion-matrix picture. The library behind ``tvq classify eval`` and the validation of
``tvq classify train`` (docs/longvq.md, "Classification")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer_vq import fileio
from transformer_vq.config import ClassifyEvalConfig
from transformer_vq.config.jobs import job_config
from transformer_vq.data.classify import Examples, ordered_batches
from transformer_vq.nn.batch_stats import recompute_batch_norm_stats
from transformer_vq.nn.inference import evaluating
from transformer_vq.train.checkpoint.store import run_dir_of
from transformer_vq.train.device import use_threads
from transformer_vq.train.classify.build import (check_data_fits, check_eval_dataset, classifier_from_checkpoint,
                                                 load_classify_data, refuse_data_path_of_generated)

BATCH_NORM_EXAMPLES = 512
"""Training examples (the first ones, in order) whose batches re-estimate a batch-normed model's statistics before
it is scored (:func:`refresh_batch_norm`): enough for means within a few percent of the spread, a few seconds on a
CPU even at 1,024 tokens."""


@dataclass
class ClassifyEvalResult:
    """What a classifier scored on one split."""

    split: str
    examples: int
    loss: float
    """Mean cross-entropy in nats per example."""
    accuracy: float
    confusion: list[list[int]]
    """``confusion[true][predicted]``: how many examples of class ``true`` were predicted as ``predicted``."""
    class_names: list[str] = field(default_factory=list)
    seconds: float = 0.0
    step: int | None = None
    """The training step of the evaluated checkpoint (set by :func:`classify_eval`)."""
    plot: str | None = None
    """Where :func:`classify_eval` wrote the confusion-matrix PNG."""

    @property
    def per_class_accuracy(self) -> list[float | None]:
        """The accuracy on the examples of each class (None for a class the split has no example of)."""
        return [row[i] / sum(row) if sum(row) else None for i, row in enumerate(self.confusion)]

    def summary(self) -> dict:
        """The numbers logged at every validation: loss, accuracy, examples."""
        return {"loss": self.loss, "accuracy": self.accuracy, "examples": self.examples}

    def to_dict(self) -> dict:
        """Everything, JSON-ready (the output of ``tvq classify eval --json``)."""
        return {"split": self.split, "step": self.step, **self.summary(), "per_class_accuracy": self.per_class_accuracy,
                "confusion": self.confusion, "class_names": self.class_names, "plot": self.plot,
                "seconds": self.seconds}


def evaluate_examples(model: torch.nn.Module, examples: Examples, *, n_classes: int, batch_size: int,
                      pad_id: int = 0, precision: str = "float32", split: str = "validation",
                      class_names=()) -> ClassifyEvalResult:
    """Score ``model`` (``model(ids, mask=...)`` -> an output with ``logits [B, C]``) on every example of
    ``examples`` in order, in eval mode (restored afterwards); nothing in the model changes."""
    device = next(model.parameters()).device
    confusion = torch.zeros(n_classes * n_classes, dtype=torch.long)
    total_loss = 0.0
    begin = time.perf_counter()
    with evaluating(model), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        for ids, mask, labels in ordered_batches(examples, batch_size, pad_id=pad_id):
            logits = model(ids.to(device), mask=mask.to(device)).logits
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).cpu()  # bfloat16 -> float32
            total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            confusion += torch.bincount(labels * n_classes + logits.argmax(dim=-1), minlength=n_classes ** 2)
    table = confusion.view(n_classes, n_classes)
    count = len(examples)
    return ClassifyEvalResult(split=split, examples=count, loss=total_loss / count,
                              accuracy=table.diagonal().sum().item() / count, confusion=table.tolist(),
                              class_names=list(class_names), seconds=time.perf_counter() - begin)


def refresh_batch_norm(model: torch.nn.Module, train: Examples, *, batch_size: int, pad_id: int = 0) -> int:
    """Take the statistics of every batch norm of ``model`` afresh from the first :data:`BATCH_NORM_EXAMPLES`
    examples of ``train`` under its weights as they are (:mod:`transformer_vq.nn.batch_stats`: running averages lag
    the weights). Every score of a classifier goes through here first, validation in training and ``tvq classify
    eval`` alike, so a checkpoint scores the same whichever step saved it and whatever its running averages were.
    Deterministic; returns the number of batches used (0 for a model without batch norm)."""
    device = next(model.parameters()).device
    first = train.window(0, min(len(train), BATCH_NORM_EXAMPLES))
    return recompute_batch_norm_stats(model, ((ids.to(device), mask.to(device)) for ids, mask, _ in
                                              ordered_batches(first, batch_size, pad_id=pad_id)))


def confusion_png(result: ClassifyEvalResult, path: str | Path) -> Path:
    """Draw ``result``'s confusion matrix (rows: true class, columns: predicted; each row normalized to the share
    of its class's examples) into the PNG file ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = torch.tensor(result.confusion, dtype=torch.float64)
    shares = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    n = len(result.confusion)
    names = result.class_names or [str(i) for i in range(n)]
    size = max(4.0, 0.45 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(shares.numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ax.set_xticks(range(n), names, rotation=90 if n > 10 or max(map(len, names)) > 3 else 0)
    ax.set_yticks(range(n), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"{result.split}: accuracy {result.accuracy:.4f} ({result.examples} examples)")
    if n <= 20:  # the counts stay readable
        for i in range(n):
            for j in range(n):
                ax.text(j, i, int(counts[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if shares[i, j] > 0.5 else "black")
    fig.tight_layout()
    path = fileio.save_png(fig, path, dpi=100, default_name=f"confusion_{result.split}.png")
    plt.close(fig)
    return path



def classify_eval(cfg: ClassifyEvalConfig | str = "runs/classify", **options) -> ClassifyEvalResult:
    """Evaluate a classification checkpoint as ``cfg`` says (or the checkpoint path ``cfg`` with ``options`` as the
    other fields of :class:`ClassifyEvalConfig`) and write its confusion-matrix PNG; the Python form of
    ``tvq classify eval``. The result's ``plot`` is where the picture went. A batch-normed model is scored with
    statistics re-estimated as in training's validation (:func:`refresh_batch_norm`): a periodic checkpoint, or one
    saved before validation re-estimated them, holds lagging running averages that would score it lower."""
    cfg = job_config(ClassifyEvalConfig, cfg, **options)
    use_threads(cfg.threads)
    model, run_cfg, ckpt = classifier_from_checkpoint(cfg.ckpt, device=cfg.device)
    refuse_data_path_of_generated(ckpt, cfg.data_path)
    data = load_classify_data(run_cfg.train, data_path=cfg.data_path)
    check_eval_dataset(ckpt, data, cfg.data_path)  # before batch norm takes statistics from its train split
    check_data_fits(run_cfg, data)
    refresh_batch_norm(model, data.split("train"), batch_size=run_cfg.train.batch_size, pad_id=data.pad_id)
    result = evaluate_examples(model, data.split(cfg.split), n_classes=data.n_classes,
                               batch_size=cfg.batch_size or run_cfg.train.eval_batch_size, pad_id=data.pad_id,
                               precision=run_cfg.train.precision, split=cfg.split, class_names=data.class_names)
    result.step = ckpt.step
    result.plot = str(confusion_png(result, cfg.plot or run_dir_of(ckpt) / f"confusion_{cfg.split}.png"))
    return result
