"""Classification training (LongVQ's Sec. 5-6) on the engine of :mod:`transformer_vq.train.trainer`: the library
behind ``tvq classify train``.

Per step::

    ids, mask, labels = next(batches)                 # padded batch of whole sequences, mask True on real tokens
    out = model(ids, mask=mask, labels=labels)        # loss = CE + commit_coef * commitment loss (eq. 23)
    (the engine's guarded step: clip (AdamW, gradient clip 0.1), apply or skip)
    every eval_every steps and at the end: batch-norm statistics re-estimated (a batch-normed model), then accuracy
    and loss on validation; a new best is saved to RUN/best/

Checkpoints hold, beside the engine's part, the data position and the best validation so far, so a resumed run
continues bit for bit, and the dataset's identity, so that it continues on the same examples (another dataset is
refused; the same one moved is not). docs/longvq.md, "Classification".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_vq.config import ClassifyConfig
from transformer_vq.data.classify import ClassBatches
from transformer_vq.train.checkpoint.errors import CheckpointError
from transformer_vq.train.checkpoint.resume import check_resume, check_same_data, refuse_over_checkpoints_of
from transformer_vq.train.checkpoint.rundir import hold_run_dir, writing
from transformer_vq.train.checkpoint.store import BEST_DIR, Checkpoint, save_checkpoint
from transformer_vq.train.classify.build import (build_classifier, check_data_fits, check_data_named,
                                                 classify_config_of, dataset_record, load_classify_data)
from transformer_vq.train.classify.evaluate import ClassifyEvalResult, evaluate_examples, refresh_batch_norm
from transformer_vq.train.device import training_device
from transformer_vq.train.fits import check_fits
from transformer_vq.train.parallel.distributed import Distributed, one_process
from transformer_vq.train.trainer import RunResult, Step, Trainer

@dataclass
class ClassifyResult(RunResult):
    """How a call to :func:`classify_train` ended; ``validation`` is a :class:`ClassifyEvalResult`."""

    best: dict | None = None
    """The best validation so far: ``step``, ``accuracy``, ``loss``, ``examples`` (its weights are in RUN/best/)."""


def classify_train(cfg: ClassifyConfig, *, resume: str | None = None, data=None,
                   _skip_restore: frozenset = frozenset()) -> ClassifyResult:
    """Train a sequence classifier as ``cfg`` says; the Python form of ``tvq classify train``.

    Args:
        cfg: model and training configuration (:func:`transformer_vq.config.classify_config` builds one from the
            dataset's sizes).
        resume: ``None`` for a new run (refused where the run directory has checkpoints), ``"auto"`` to continue
            from its latest complete checkpoint when there is one, or a run or checkpoint directory.
        data: the loaded dataset, when the caller has it already (else ``cfg.train`` names it): the one
            ``cfg.train`` names (its ``data``, ``data_path`` and ``data_options``; refused otherwise).
        _skip_restore: for tests only: parts of a checkpoint ({"data", "rng"}) not to restore.

    Raises :class:`~transformer_vq.train.guard.TrainingError`, :class:`CheckpointError` (``RunDirError`` for an
    unusable or busy run directory), ``ConfigError`` or the data layer's ``DataError``, each with a message.
    """
    one_process("tvq classify trains")
    check_resume(cfg.train.resolved_run_dir(), resume, cfg.train)  # before the dataset (when not given) is made
    if data is not None:  # before the run directory is touched
        check_data_named(cfg.train, data)
    device = training_device(cfg.train)
    check_fits(lambda: build_classifier(cfg), cfg.train.optimizer, device, task="classify")
    with hold_run_dir(cfg.train.resolved_run_dir(), Distributed()):
        refuse_over_checkpoints_of(cfg.train.resolved_run_dir(), resume)  # before the data is read
        trainer = ClassifyTrainer(cfg, device, data)
        exit_code = trainer.run(resume, _skip_restore)
    return ClassifyResult(run_dir=trainer.run_dir, step=trainer.step, exit_code=exit_code,
                          validation=trainer.validation if exit_code == 0 else None, best=trainer.best,
                          tokens_per_s=trainer.tokens_per_s)


class ClassifyTrainer(Trainer):
    """The classification task: padded batches of whole sequences, one label each, in one process."""

    def __init__(self, cfg: ClassifyConfig, device: torch.device, data):
        tc = cfg.train
        self.data = data if data is not None else load_classify_data(tc)
        check_data_fits(cfg, self.data)
        # what identifies the dataset, saved in every checkpoint (best too) and compared on resume and by eval
        # --data-path (the dataset never changes)
        self.data_identity = dataset_record(self.data, tc.data_path)
        self.batches = ClassBatches(self.data.split("train"), batch_size=tc.batch_size, seed=tc.seed,
                                    pad_id=self.data.pad_id)
        super().__init__(cfg, Distributed(), device, lambda: build_classifier(cfg))
        self.labels: torch.Tensor | None = None  # of the current batch
        self.best: dict | None = None

    def forward_backward(self) -> Step:
        ids, mask, self.labels = (t.to(self.device) for t in next(self.batches))
        with self.autocast():
            out = self.forward(ids, mask=mask, labels=self.labels)
        out.loss.backward()
        return Step(output=out, tokens=int(mask.sum()))

    def after_step(self, step: Step, ce_loss: float) -> dict:
        return {"accuracy": (step.output.logits.argmax(dim=-1) == self.labels).double().mean().item()}

    def checkpoint_state(self) -> dict:
        return {"data": self.batches.state_dict(), "best": self.best, "dataset": self.data_identity}

    def check_checkpoint(self, ckpt: Checkpoint) -> None:
        saved = classify_config_of(ckpt).train.arch
        if saved != self.tc.arch:
            raise CheckpointError(f"checkpoint {ckpt.path} holds a {saved} classifier and this run asks for --arch "
                                  f"{self.tc.arch}; resume with --arch {saved}, or start a new run with another "
                                  f"--run-dir")

    def load_checkpoint_state(self, state: dict, skip: frozenset) -> None:
        if "data" not in skip and "dataset" in state:  # absent from checkpoints of before it was saved
            # another --data-path (or a generated dataset where a release was read): the saved data position, the
            # validation split and the best validation it compares with would belong to other examples
            check_same_data(state["dataset"], self.data_identity, self.run_dir, noun="dataset", unit="examples")
        self.best = state["best"]
        if "data" not in skip:
            self.batches.load_state_dict(state["data"])

    def on_start(self) -> None:
        data = self.data
        self.announce(f"{self.tc.arch} classifier", f"{data.name} ({len(data.split('train')):,} training examples, "
                      f"{data.n_classes} classes)", f"{self.tc.batch_size} examples on {self.device.type}", digits=3)
        fields = {**self.cfg.recipe.get("model", {}), **self.cfg.recipe.get("train", {})}
        if fields:
            self.log(f"{data.name}'s recipe for {self.tc.arch} set " + ", ".join(f"{k} {v}" for k, v in fields.items())
                     + " (flags override it; a new run with --preset starts without it)", flush=True)

    def validate(self) -> ClassifyEvalResult:
        """Score the validation split, log it, and save a new best to RUN/best/. A batch-normed model first takes
        its statistics from the current weights (their running averages lag them)."""
        data = self.data
        refresh_batch_norm(self.model, data.split("train"), batch_size=self.tc.batch_size, pad_id=data.pad_id)
        result = evaluate_examples(self.model, data.split("validation"), n_classes=data.n_classes,
                                   batch_size=self.tc.eval_batch_size, pad_id=data.pad_id,
                                   precision=self.tc.precision, class_names=data.class_names)
        self.log_eval(result.summary())
        best = self.best
        if best is None or (result.accuracy, -result.loss) > (best["accuracy"], -best["loss"]):
            self.best = {"step": self.step, **result.summary()}
            with writing(self.run_dir, "save the best checkpoint"):
                save_checkpoint(self.run_dir / BEST_DIR, step=self.step, model=self.model, config=self.cfg.to_dict(),
                                state={"validation": self.best, "dataset": self.data_identity}, keep=1)
            self.logger.print(f"step {self.step}: new best validation accuracy {result.accuracy:.4f} "
                              f"(saved to {self.run_dir / BEST_DIR})")
        return result
