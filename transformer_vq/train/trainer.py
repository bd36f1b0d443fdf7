"""The training engine every task shares: :class:`Trainer` runs the loop, the guarded step, stopping, saving and
resuming; a task (``train/lm``, ``train/classify``) subclasses it and fills in a few hooks.

Per step::

    step = forward_backward()                     # task: next batch, forward, backward
    clip the gradient; one collective: the mean losses, a non-finite flag, the workers' stop requests
    if loss, gradient and learning rate are finite:
        optimizer.step(); all-reduce codebook statistics; model.update_codebooks()
    else:
        skip: weights, optimizer and codebooks untouched (the statistics are discarded)
    after_step(step)                              # task: carried state, the task's own metrics
    too many skipped steps in a row -> save, stop with a TrainingError
    validation due -> validate()                  # task: score, log, keep what it needs (a best checkpoint)
    checkpoint due, or stop requested -> save()
    stop requested -> return 128 + the signal's number

Validation comes before the save of the same step, always. The checkpoint of step N then holds everything the
validation of step N changed (the classifier's best validation; any random numbers evaluation draws), so a run
resumed from it continues exactly as an uninterrupted one, with no pending work to carry in the checkpoint. A kill
between the two loses nothing either: the checkpoint of step N does not exist yet, so the resumed run replays from the
previous checkpoint and validates step N again. (The other order loses that validation: a kill after the save and
before the validation resumes past step N and never runs it.) The cost: a stop signal that arrives on a validation
step waits for that validation before the save (it stops the run there, one collective after the validation).

Hooks a task overrides (every worker calls each one; see their docstrings): :meth:`forward_backward`,
:meth:`after_step`, :meth:`checkpoint_state` / :meth:`load_checkpoint_state`, :meth:`validate`, and optionally
:meth:`stop_requested`, :meth:`check_checkpoint`, :meth:`on_start`, :meth:`finish`. The engine knows no data, no
model family and no metric beyond losses; checkpointing gets what it needs from here (the workers, the cross-worker
search for non-finite shards), so ``train/checkpoint`` never imports ``train/parallel``.
"""

from __future__ import annotations

import math
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from transformer_vq import fileio
from transformer_vq.models.tvq.compile import compile_units
from transformer_vq.train.checkpoint.resume import (checkpoint_to_resume, refuse_changed_fields,
                                                   refuse_fresh_over_checkpoints, refuse_steps_below)
from transformer_vq.train.checkpoint.rundir import writing
from transformer_vq.train.checkpoint.store import (CHECKPOINTS_DIR, Checkpoint, save_checkpoint,
                                                  save_sharded_checkpoint, step_name)
from transformer_vq.train.finite import nonfinite_names
from transformer_vq.train.guard import nonfinite_weights_error, skip_reason, too_many_skipped_error
from transformer_vq.train.metrics import MetricsLogger, finite_or_none, graphs_compiled
from transformer_vq.train.optim import (apply_schedule, build_optimizer, build_scheduler, stretched_schedule_note,
                                        warmup_note)
from transformer_vq.train.parallel.distributed import Distributed, data_parallel
from transformer_vq.train.parallel.fsdp import nonfinite_shards, shard_model, to_float
from transformer_vq.train.rng import rng_state, set_rng_state
from transformer_vq.train.signals import StopRequest


@dataclass
class RunResult:
    """How a call to a task's training function ended (each task adds what else it reports)."""

    run_dir: Path
    step: int
    """Optimizer steps done (including steps from before a resume)."""
    exit_code: int
    """0 when all steps ran; 128 + signal number when stopped by SIGTERM (143) or SIGINT (130), saved first."""
    validation: Any = None
    """The validation at the end of training (a run that completed; rank 0's)."""
    tokens_per_s: float | None = None
    """Training tokens per second over this call's steps (all workers together) but those that compiled a graph."""


@dataclass
class Step:
    """What a task's :meth:`Trainer.forward_backward` hands the engine."""

    output: Any
    """The model's output: scalar ``loss`` (its backward done), ``ce_loss`` and ``commit_loss``."""
    tokens: int
    """Tokens this step trained on, all workers together (for the throughput)."""


class Trainer:
    """One training run of ``cfg`` (``cfg.train`` its training fields, ``cfg.to_dict()`` what checkpoints save);
    :meth:`run` is the loop. ``build`` makes the model, after the seed that makes it the same on every worker;
    ``torch_compile``: compile its units (after FSDP's sharding, as FSDP2 asks)."""

    def __init__(self, cfg, dist: Distributed, device: torch.device, build: Callable[[], torch.nn.Module], *,
                 torch_compile: bool = False):
        self.cfg, self.tc, self.dist, self.device = cfg, cfg.train, dist, device
        tc = cfg.train
        self.run_dir: Path = tc.resolved_run_dir()
        self.ckpt_root = self.run_dir / CHECKPOINTS_DIR
        self.config_unwritten = False  # a resumed run's config.json waits for its first checkpoint (_start)
        self.log = print if dist.is_main else (lambda *a, **k: None)
        torch.manual_seed(tc.seed)  # identical initial weights on every worker
        self.model = build().to(device)
        self.model.train()
        if dist.fsdp:
            shard_model(self.model, tc.precision)  # before the optimizer: its parameters become the shards
        if torch_compile:
            compile_units(self.model)  # after sharding, as FSDP2 asks; the weights and checkpoints stay the same
        self.optimizer = build_optimizer(self.model, tc)
        self.scheduler = build_scheduler(self.optimizer, tc)
        # dropout draws from a stream of its own, different on every worker as their data is
        torch.manual_seed(tc.seed * 1_000_003 + 1 + dist.rank)
        # LayerDrop (Transformer-VQ's droplyr) leaves a skipped unit's parameters without gradients
        find_unused = getattr(cfg.model, "droplyr", 0.0) > 0
        self.forward = data_parallel(self.model, dist, device, find_unused=find_unused)
        self.step = 0
        self.nonfinite_run = 0
        self.skip_reason: str | None = None  # why the last step was skipped
        self.stop = StopRequest(announce=dist.is_main, hold=dist.enabled)  # handles signals while the loop runs
        self.logger: MetricsLogger | None = None  # the main process's, while the loop runs
        self.validation = None  # the last validation of this call (on the workers that evaluate)
        self.validated_at: int | None = None  # its step (on every worker)
        self.eval_logged = False  # whether the validation of this step is in metrics.jsonl already
        self.validated_here = False  # whether this call validated (every worker: the DDP workers but rank 0 don't)

    def release_data_parallel(self) -> None:
        """Drop DDP's wrapper (its C++ reducer holds the process group), before the group is destroyed: see
        :func:`~transformer_vq.train.parallel.distributed.teardown_distributed`. The trainer cannot train after."""
        self.forward = None

    # ---- hooks ---------------------------------------------------------------------------------------

    def forward_backward(self) -> Step:
        """Draw the next batch, run the forward pass (under :meth:`autocast`) through :attr:`forward` and the
        backward pass of its loss."""
        raise NotImplementedError

    def after_step(self, step: Step, ce_loss: float) -> dict:
        """After the step, applied or skipped (:attr:`skip_reason`); ``ce_loss`` is the workers' mean. Returns the
        task's metrics of the step (logged after the losses)."""
        return {}

    def checkpoint_state(self) -> dict:
        """The task's part of a checkpoint's state: tensors and plain data (every worker calls it: it may gather)."""
        return {}

    def load_checkpoint_state(self, state: dict, skip: frozenset) -> None:
        """Restore what :meth:`checkpoint_state` saved, after the engine restored its part; ``skip`` (tests only)
        names parts not to restore (``"data"``)."""

    def validate(self):
        """Score the validation split, log it (:meth:`log_eval`), and return the result (on the workers that
        :attr:`evaluates`)."""
        raise NotImplementedError

    def stop_requested(self) -> bool:
        """Whether this worker asks to stop after this step (a SIGTERM / SIGINT came); the engine stops if any asks."""
        return self.stop.signum is not None

    def check_checkpoint(self, ckpt: Checkpoint) -> None:
        """Refuse a checkpoint this run cannot continue, before anything of it is loaded."""

    def on_start(self) -> None:
        """On the main process, once the run's config.json is written: write the task's files, announce the run."""

    def finish(self) -> None:
        """After the last step of a run that completed (on the workers that :attr:`evaluates`)."""

    # ---- what hooks use ------------------------------------------------------------------------------

    def autocast(self):
        """The training precision's autocast context (bfloat16 computation; parameters stay float32)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.tc.precision == "bfloat16")

    @property
    def evaluates(self) -> bool:
        """Whether this worker validates: rank 0, or under FSDP every worker (each forward gathers the shards of all
        of them; they compute the same result, rank 0 logs it)."""
        return self.dist.is_main or self.dist.fsdp

    def announce(self, model: str, data: str, step: str, *, digits: int = 2) -> None:
        """Print the line that opens a run: what ``model`` of how many parameters trains on ``data``, and what one
        step takes (``step``)."""
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"training a {n_params / 1e6:.{digits}f}M-parameter {model} on {data} for {self.tc.steps} steps of "
                 f"{step}; run directory {self.run_dir}", flush=True)
        note = warmup_note(warmup_steps=self.tc.warmup_steps, total_steps=self.tc.steps)
        if note is not None:
            self.log(note, flush=True)

    def log_eval(self, result: dict) -> None:
        """Record a validation of the current step (main process)."""
        if self.logger is not None and not self.eval_logged:
            with writing(self.run_dir, "write metrics.jsonl"):
                self.logger.log_eval(self.step, "validation", result)

    # ---- one step ------------------------------------------------------------------------------------

    def train_step(self) -> dict:
        """One guarded optimizer step; returns ``{"metrics": ..., "stop": ...}``, both the same on every worker."""
        begin, graphs = time.perf_counter(), graphs_compiled()
        step = self.forward_backward()
        out, tc = step.output, self.tc
        max_norm = tc.grad_clip if tc.optimizer == "adamw" and tc.grad_clip > 0 else math.inf
        # over FSDP's sharded gradients the norm is a DTensor reduced over every worker: the global norm
        grad_norm = to_float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        # one collective for the logged losses and the flags every worker must agree on
        shared = torch.tensor([out.loss.item(), out.ce_loss.item(), out.commit_loss.item(),
                               float(not math.isfinite(out.loss.item())), float(self.stop_requested())],
                              dtype=torch.float64, device=self.device)  # nccl reduces only GPU tensors
        self.dist.all_reduce_sum_([shared])
        loss, ce_loss, commit_loss = (shared[:3] / self.dist.world_size).tolist()
        lr = self.scheduler.get_last_lr()[0]
        self.skip_reason = skip_reason(shared[3].item() == 0, grad_norm, self.scheduler.get_last_lr())
        self._apply(lr) if self.skip_reason is None else self._skip()
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped step advances the schedule on purpose (the step still counts)
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()
        self.step += 1
        task_metrics = self.after_step(step, ce_loss)
        seconds, compiled = time.perf_counter() - begin, graphs_compiled() > graphs  # the rate leaves it out
        metrics = {
            "step": self.step, "loss": finite_or_none(loss), "ce_loss": finite_or_none(ce_loss),
            "commit_loss": finite_or_none(commit_loss), **task_metrics, "lr": lr,
            "grad_norm": finite_or_none(grad_norm), "tokens": step.tokens, "seconds": seconds,
            "tokens_per_s": step.tokens / seconds, "compiled": compiled, "skipped": self.skip_reason is not None,
            **self.model.codebook_metrics(),
        }
        return {"metrics": metrics, "stop": shared[4].item() > 0}

    def _apply(self, lr: float) -> None:
        """Apply the step: weights, then the codebooks from every worker's statistics."""
        self.optimizer.step()
        bad = nonfinite_shards(self.model.named_parameters(), self.dist, self.device) if self.dist.fsdp \
            else nonfinite_names(self.model.named_parameters())
        if bad:  # identical weights on every worker: all of them stop here
            raise nonfinite_weights_error(self.step + 1, bad, lr)
        self.dist.all_reduce_sum_(self.model.codebook_stats(self.dist.rank, self.dist.world_size))
        self.model.update_codebooks()
        self.nonfinite_run = 0

    def _skip(self) -> None:
        """Skip the step: weights, optimizer and codebooks untouched (the statistics are discarded)."""
        self.model.reset_codebook_stats()
        self.nonfinite_run += 1

    # ---- checkpoints ---------------------------------------------------------------------------------

    def save(self) -> None:
        """Save checkpoint :attr:`step` (a collective: every worker calls it)."""
        # every worker's generators, in rank order
        rngs = self.dist.all_gather_object(rng_state())
        task = self.checkpoint_state()
        if self.config_unwritten and self.dist.is_main:  # this attempt trained: its flags are the run's from here on
            self._write_config()
        if self.dist.is_main or self.dist.fsdp:  # FSDP: every worker writes its shards
            state = {**({} if self.dist.fsdp else {"optimizer": self.optimizer.state_dict()}),  # FSDP: in the shards
                     "scheduler": self.scheduler.state_dict(), "nonfinite_run": self.nonfinite_run,
                     "world_size": self.dist.world_size, "rng": rngs, "validated_at": self.validated_at, **task}
            with writing(self.run_dir, f"save checkpoint {step_name(self.step)}"):
                common = {"step": self.step, "model": self.model, "config": self.cfg.to_dict(), "state": state,
                          "keep": self.tc.keep_ckpts}
                path = save_sharded_checkpoint(
                    self.ckpt_root, optimizer=self.optimizer, dist_info=self.dist, **common,
                    nonfinite_shards=lambda named: nonfinite_shards(named, self.dist, self.device),
                ) if self.dist.fsdp else save_checkpoint(self.ckpt_root, **common)
            self.log(f"saved checkpoint {path}", flush=True)
        self.config_unwritten = False
        self.dist.barrier()

    def restore(self, resume: str, skip: frozenset) -> bool:
        """Continue from the checkpoint ``resume`` names (nothing when ``"auto"`` finds none: returns False); ``skip``
        (tests only): parts not to restore, ``"data"`` and ``"rng"``."""
        ckpt = checkpoint_to_resume(self.ckpt_root, resume, self.log)
        if ckpt is None:
            return False
        # check_resume read the newest checkpoint's config before anything loaded; this one may be older (the newer
        # damaged), or named by a caller that built a Trainer itself: its own fields are the ones that must match
        refuse_steps_below(ckpt.path, ckpt.step, self.tc.steps)
        self.check_checkpoint(ckpt)
        refuse_changed_fields(ckpt.config.get("train", {}), self.tc, ckpt.path)
        state = ckpt.state
        ckpt.load_training_state(self.model, self.optimizer, sharded=self.dist.fsdp)
        self.scheduler.load_state_dict(state["scheduler"])
        # the flags given with --resume (peak lr, weight decay, steps) apply at the point of the schedule reached
        saved_steps = ckpt.config.get("train", {}).get("steps")
        if note := stretched_schedule_note(saved_steps, self.tc, self.scheduler.last_epoch):
            self.log(note)
        apply_schedule(self.optimizer, self.scheduler, self.tc)
        self.step, self.nonfinite_run = ckpt.step, int(state["nonfinite_run"])
        self.validated_at = state.get("validated_at")  # absent from checkpoints of before it was saved
        if "rng" not in skip:
            self._restore_rng(state["rng"])
        self.load_checkpoint_state(state, skip)
        self.log(f"resumed from {ckpt.path} at step {self.step}")
        return True

    def _restore_rng(self, saved: list) -> None:
        if len(saved) == self.dist.world_size:
            return set_rng_state(saved[self.dist.rank])
        torch.manual_seed(self.tc.seed * 1_000_003 + 1 + self.dist.rank + 7919 * self.step)
        drawn = [name for name in ("dropsin", "dropres", "droplyr", "dropout", "dead_code_restart")
                 if getattr(self.cfg.model, name, 0)]  # what draws from them in training; else nothing changes
        if drawn:
            self.log(f"warning: the checkpoint was saved by {len(saved)} worker{'s' * (len(saved) != 1)}, this run "
                     f"has {self.dist.world_size}: the random draws of {', '.join(drawn)} continue from new seeds")

    # ---- the loop ------------------------------------------------------------------------------------

    def run(self, resume: str | None, skip: frozenset = frozenset()) -> int:
        """Train to ``steps`` (returns 0) or to a stop signal (returns 128 + its number), from a fresh start
        (``resume`` None) or from the checkpoint ``resume`` names."""
        self._start(resume, skip)
        if self.dist.is_main:
            with writing(self.run_dir, "open metrics.jsonl and tb/"):
                self.logger = MetricsLogger(self.run_dir, total_steps=self.tc.steps, start_step=self.step,
                                            log_every=self.tc.log_every)
        try:
            exit_code = self._loop()
            if exit_code == 0:
                if not self.validated_here:  # resumed at the last step: no step ran in this call
                    self._finish_resumed()
                if self.evaluates:
                    self.finish()
        finally:
            if self.logger is not None:
                self.logger.close()
        return exit_code

    @property
    def tokens_per_s(self) -> float | None:
        """:attr:`RunResult.tokens_per_s` of this call (main process; None elsewhere or before such a step)."""
        return self.logger.tokens_per_s if self.logger is not None else None

    def _start(self, resume: str | None, skip: frozenset) -> None:
        """Check the run directory, restore a checkpoint, and record the run's config (main process)."""
        if self.dist.is_main:
            # temporary directories of killed saves, checkpoints whose pruning was killed midway
            fileio.clean_debris(self.ckpt_root)
        refuse_fresh_over_checkpoints(self.ckpt_root, self.run_dir, resume)
        resumed = resume is not None and self.restore(resume, skip)
        # A resumed run's config.json (what the next --resume auto starts from) is rewritten at its first checkpoint,
        # not before: an attempt with other flags that fails before it trains a step must not change it.
        self.config_unwritten = resumed
        if self.dist.is_main:
            if not resumed:
                self._write_config()
            self.on_start()

    def _write_config(self) -> None:
        """The run's config.json (main process)."""
        with writing(self.run_dir, "write the run's config.json"):
            fileio.atomic_write_text(self.run_dir / "config.json", self.cfg.to_json())

    def _loop(self) -> int:
        tc = self.tc
        with self.stop:
            while self.step < tc.steps:
                result = self.train_step()
                if self.logger is not None:
                    self._log_step(result["metrics"])
                if self.nonfinite_run >= tc.max_nonfinite:
                    self.save()
                    raise too_many_skipped_error(self.step, self.nonfinite_run, self.skip_reason, tc.max_nonfinite)
                if self.step == tc.steps or (tc.eval_every and self.step % tc.eval_every == 0):
                    # before the save (module docstring); a signal during it stops the run here, not a step later
                    result["stop"] = self._validate() or result["stop"]
                if result["stop"] or self.step % tc.ckpt_every == 0 or self.step == tc.steps:
                    self.save()
                if result["stop"]:
                    return 128 + (self.stop.signum or signal.SIGTERM)
        return 0

    def _validate(self) -> bool:
        """Validate (the workers that evaluate); returns whether any worker was asked to stop meanwhile."""
        if self.evaluates:
            self.validation = self.validate()
        self.validated_at, self.validated_here = self.step, True
        return self.dist.any_(self.stop_requested(), self.device)

    def _finish_resumed(self) -> None:
        """A run resumed from the checkpoint of its last step (killed after that save, or a finished run resumed
        again): finish what the end of a run does. Its validation ran before the save, unless the checkpoint
        predates that order; it runs again for the result this call reports (evaluation is deterministic, so it is
        the logged one) without a second line in metrics.jsonl."""
        self.log(f"the run is at its last step ({self.step}): nothing to train; the end of the run follows")
        self.eval_logged = self.validated_at == self.step
        self._validate()

    def _log_step(self, metrics: dict) -> None:
        with writing(self.run_dir, "write metrics.jsonl"):
            self.logger.log_step(metrics)
        if metrics["skipped"]:
            self.logger.print(f"step {self.step}: non-finite {self.skip_reason}, step skipped "
                              f"({self.nonfinite_run} in a row)")
