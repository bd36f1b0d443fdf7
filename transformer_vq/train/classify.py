"""The classification training loop (LongVQ's Sec. 5-6): the library behind ``tvq classify train``.

Per step::

    ids, mask, labels = next(batches)                 # padded batch of whole sequences, mask True on real tokens
    out = model(ids, mask=mask, labels=labels)        # loss = CE + commit_coef * commitment loss (eq. 23)
    backward; clip (AdamW, gradient clip 0.1)
    if loss and gradient are finite: optimizer.step(); model.update_codebooks()
    else: skip (weights, optimizer and codebooks untouched)
    every eval_every steps and at the end: accuracy and loss on validation; a new best is saved to RUN/best/

It shares the run directory, its lock, atomic checkpoints, ``--resume``, the signal handling, the metrics logger and
the optimizer of language-model training (loop.py). Checkpoints hold weights, codebooks, optimizer, scheduler,
step, the data position, the RNG states and the best validation so far, so a resumed run continues bit for bit.
docs/longvq.md, "Classification".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_vq import fileio
from transformer_vq.config import ClassifyConfig, ConfigError
from transformer_vq.data.classify import ClassBatches
from transformer_vq.train.build import training_device
from transformer_vq.train.checkpoint import CheckpointError, save_checkpoint, step_name
from transformer_vq.train.finite import nonfinite_names
from transformer_vq.train.classify_build import build_classifier, check_data_fits, classify_config_of, load_classify_data
from transformer_vq.train.classify_eval import ClassifyEvalResult, evaluate_examples
from transformer_vq.train.distributed import Distributed
from transformer_vq.train.guard import nonfinite_weights_error, skip_reason, too_many_skipped_error
from transformer_vq.train.metrics import MetricsLogger, finite_or_none
from transformer_vq.train.optim import build_optimizer, build_scheduler
from transformer_vq.train.resume import checkpoint_to_resume, refuse_fresh_over_checkpoints
from transformer_vq.train.rng import rng_state, set_rng_state
from transformer_vq.train.rundir import hold_run_dir, writing
from transformer_vq.train.signals import StopRequest

BEST_DIR = "best"
"""The run directory's folder holding the checkpoint of the best validation accuracy (one, replaced on a new best)."""


@dataclass
class ClassifyResult:
    """How a call to :func:`classify_train` ended."""

    run_dir: Path
    step: int
    exit_code: int
    """0 when all steps ran; 143 (SIGTERM) or 130 (SIGINT) when stopped by a signal (saved first)."""
    validation: ClassifyEvalResult | None = None
    """The validation at the end of training."""
    best: dict | None = None
    """The best validation so far: ``step``, ``accuracy``, ``loss``, ``examples`` (its weights are in RUN/best/)."""
    tokens_per_s: float | None = None


def classify_train(cfg: ClassifyConfig, *, resume: str | None = None, data=None,
                   _skip_restore: frozenset = frozenset()) -> ClassifyResult:
    """Train a sequence classifier as ``cfg`` says; the Python form of ``tvq classify train``.

    Args:
        cfg: model and training configuration (:func:`transformer_vq.config.classify_config` builds one from the
            dataset's sizes).
        resume: ``None`` for a new run (refused where the run directory has checkpoints), ``"auto"`` to continue
            from its latest complete checkpoint when there is one, or a run or checkpoint directory.
        data: the loaded dataset, when the caller has it already (else ``cfg.train`` names it).
        _skip_restore: for tests only: parts of a checkpoint ({"data", "rng"}) not to restore.

    Raises :class:`~transformer_vq.train.guard.TrainingError`, :class:`CheckpointError` (``RunDirError`` for an
    unusable or busy run directory), ``ConfigError`` or the data layer's ``DataError``, each with a message.
    """
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("tvq classify trains in one process; run it without torchrun")
    device = training_device(cfg.train)
    with hold_run_dir(cfg.train.resolved_run_dir(), Distributed()):
        return _ClassifyTrainer(cfg, device, data).run(resume, _skip_restore)


class _ClassifyTrainer:
    """The state of one classification run; :meth:`run` is the loop."""

    def __init__(self, cfg: ClassifyConfig, device: torch.device, data):
        self.cfg, self.tc, self.device = cfg, cfg.train, device
        tc = cfg.train
        self.run_dir = tc.resolved_run_dir()
        self.ckpt_root = self.run_dir / "checkpoints"
        self.data = data if data is not None else load_classify_data(tc)
        check_data_fits(cfg, self.data)
        self.batches = ClassBatches(self.data.split("train"), batch_size=tc.batch_size, seed=tc.seed,
                                    pad_id=self.data.pad_id)
        torch.manual_seed(tc.seed)
        self.model = build_classifier(cfg).to(device)
        self.model.train()
        self.optimizer = build_optimizer(self.model, tc)
        self.scheduler = build_scheduler(self.optimizer, tc)
        torch.manual_seed(tc.seed * 1_000_003 + 1)  # dropout draws from a stream of its own
        self.step = 0
        self.nonfinite_run = 0
        self.skip_reason: str | None = None
        self.best: dict | None = None
        self.validation: ClassifyEvalResult | None = None

    # ---- checkpoints -------------------------------------------------------------------------------

    def save(self) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "data": self.batches.state_dict(), "rng": [rng_state()], "nonfinite_run": self.nonfinite_run,
                 "best": self.best}
        with writing(self.run_dir, f"save checkpoint {step_name(self.step)}"):
            path = save_checkpoint(self.ckpt_root, step=self.step, model=self.model, config=self.cfg.to_dict(),
                                   state=state, keep=self.tc.keep_ckpts)
        print(f"saved checkpoint {path}", flush=True)

    def restore(self, resume: str, skip: frozenset) -> None:
        ckpt = checkpoint_to_resume(self.ckpt_root, resume, print)
        if ckpt is None:
            return
        saved = classify_config_of(ckpt).train.arch
        if saved != self.tc.arch:
            raise CheckpointError(f"checkpoint {ckpt.path} holds a {saved} classifier and this run asks for --arch "
                                  f"{self.tc.arch}; resume with --arch {saved}, or start a new run with another "
                                  f"--run-dir")
        state = ckpt.state
        ckpt.load_training_state(self.model, self.optimizer, sharded=False)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.nonfinite_run, self.best = ckpt.step, int(state["nonfinite_run"]), state["best"]
        if "data" not in skip:
            self.batches.load_state_dict(state["data"])
        if "rng" not in skip:
            set_rng_state(state["rng"][0])
        print(f"resumed from {ckpt.path} at step {self.step}")

    # ---- one step ------------------------------------------------------------------------------------

    def train_step(self) -> dict:
        """One optimizer step on the next batch; returns its metrics."""
        tc = self.tc
        ids, mask, labels = (t.to(self.device) for t in next(self.batches))
        begin = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=tc.precision == "bfloat16"):
            out = self.model(ids, mask=mask, labels=labels)
        out.loss.backward()
        max_norm = tc.grad_clip if tc.optimizer == "adamw" and tc.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        loss, lr = out.loss.item(), self.scheduler.get_last_lr()[0]
        self.skip_reason = skip_reason(math.isfinite(loss), grad_norm, self.scheduler.get_last_lr())
        if self.skip_reason is None:
            self.optimizer.step()
            bad = nonfinite_names(self.model.named_parameters())
            if bad:
                raise nonfinite_weights_error(self.step + 1, bad, lr)
            self.model.update_codebooks()
            self.nonfinite_run = 0
        else:
            self.model.reset_codebook_stats()
            self.nonfinite_run += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        seconds = time.perf_counter() - begin
        tokens = int(mask.sum())
        return {
            "step": self.step, "loss": finite_or_none(loss), "ce_loss": finite_or_none(out.ce_loss.item()),
            "commit_loss": finite_or_none(out.commit_loss.item()),
            "accuracy": (out.logits.argmax(dim=-1) == labels).double().mean().item(), "lr": lr,
            "grad_norm": finite_or_none(grad_norm), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "skipped": self.skip_reason is not None,
            **self.model.codebook_metrics(),
        }

    # ---- the loop ------------------------------------------------------------------------------------

    def run(self, resume: str | None, skip: frozenset) -> ClassifyResult:
        fileio.clean_debris(self.ckpt_root)
        refuse_fresh_over_checkpoints(self.ckpt_root, self.run_dir, resume)
        if resume is not None:
            self.restore(resume, skip)
        with writing(self.run_dir, "write the run's config.json"):
            fileio.atomic_write_text(self.run_dir / "config.json", self.cfg.to_json())
        n_params = sum(p.numel() for p in self.model.parameters())
        print(f"training a {n_params / 1e6:.3f}M-parameter {self.tc.arch} classifier on {self.data.name} "
              f"({len(self.data.split('train')):,} training examples, {self.data.n_classes} classes) for "
              f"{self.tc.steps} steps of {self.tc.batch_size} examples on {self.device.type}; run directory "
              f"{self.run_dir}", flush=True)
        with writing(self.run_dir, "open metrics.jsonl and tb/"):
            logger = MetricsLogger(self.run_dir, total_steps=self.tc.steps, start_step=self.step,
                                   log_every=self.tc.log_every)
        try:
            exit_code = self._loop(logger)
            if exit_code == 0 and self.validation is None:  # resumed at the last step: nothing ran
                self._validate(logger)
        finally:
            logger.close()
        return ClassifyResult(run_dir=self.run_dir, step=self.step, exit_code=exit_code,
                              validation=self.validation if exit_code == 0 else None, best=self.best,
                              tokens_per_s=logger.tokens_per_s if logger.total_seconds else None)

    def _loop(self, logger: MetricsLogger) -> int:
        """Train until ``steps`` (returns 0) or a stop signal (returns 128 + its number)."""
        tc = self.tc
        with StopRequest() as stop:
            while self.step < tc.steps:
                metrics = self.train_step()
                with writing(self.run_dir, "write metrics.jsonl"):
                    logger.log_step(metrics)
                if metrics["skipped"]:
                    logger.print(f"step {self.step}: non-finite {self.skip_reason}, step skipped "
                                 f"({self.nonfinite_run} in a row)")
                if self.nonfinite_run >= tc.max_nonfinite:
                    self.save()
                    raise too_many_skipped_error(self.step, self.nonfinite_run, self.skip_reason, tc.max_nonfinite)
                # validated before saving: a checkpoint holds the best validation up to its step, so a resumed
                # run validates at the same steps as an uninterrupted one
                if self.step == tc.steps or (tc.eval_every and self.step % tc.eval_every == 0):
                    self._validate(logger)
                if stop.signum is not None or self.step % tc.ckpt_every == 0 or self.step == tc.steps:
                    self.save()
                if stop.signum is not None:
                    return 128 + stop.signum
        return 0

    def _validate(self, logger: MetricsLogger) -> None:
        """Score the validation split, log it, and save a new best to RUN/best/."""
        data = self.data
        result = evaluate_examples(self.model, data.split("validation"), n_classes=data.n_classes,
                                   batch_size=self.tc.eval_batch_size, pad_id=data.pad_id,
                                   precision=self.tc.precision, class_names=data.class_names)
        self.validation = result
        with writing(self.run_dir, "write metrics.jsonl"):
            logger.log_eval(self.step, "validation", result.summary())
        best = self.best
        if best is None or (result.accuracy, -result.loss) > (best["accuracy"], -best["loss"]):
            self.best = {"step": self.step, **result.summary()}
            with writing(self.run_dir, "save the best checkpoint"):
                save_checkpoint(self.run_dir / BEST_DIR, step=self.step, model=self.model, config=self.cfg.to_dict(),
                                state={"validation": self.best}, keep=1)
            logger.print(f"step {self.step}: new best validation accuracy {result.accuracy:.4f} "
                         f"(saved to {self.run_dir / BEST_DIR})")
