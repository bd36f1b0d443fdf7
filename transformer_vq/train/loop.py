"""The training loop (Sec. 3.4): truncated backprop through time over windows of ``update_len``
tokens, one optimizer step and one codebook EMA update per window, fault tolerant.

Per batch of ``[B, seq_len + 1]`` token windows::

    state = None                                   # reset at every new batch of sequences
    for each window w of update_len tokens:        # seq_len / update_len optimizer steps
        out = model(x_w, state, targets=y_w)       # loss = CE + beta * commit loss
        backward; (DDP or FSDP averages gradients); clip
        if loss and gradient are finite:
            optimizer.step(); all-reduce codebook statistics; model.update_codebooks()
        else:
            skip: weights, optimizer and codebooks untouched (the statistics are discarded)
        state = out.state.detach()                 # carried to the next window, no gradient

Fault tolerance: checkpoints every ``ckpt_every`` steps (atomic, see checkpoint.py) hold everything
needed to continue bit for bit on CPU: weights, codebooks, optimizer, scheduler, step, data
position, every worker's RNG states and, mid-batch, the carried operator state. SIGTERM / SIGINT
finish the current step, save, and make :func:`train` return exit code 143 / 130.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_vq import fileio
from transformer_vq.config import RunConfig
from transformer_vq.data.batches import check_vocab, corpus_batches
from transformer_vq.data.metrics import bits_per_byte, corpus_tokens_per_byte, corpus_tokens_per_word
from transformer_vq.nn.compile import compile_units
from transformer_vq.train.build import build_model, load_corpus_for, save_run_tokenizer, training_device
from transformer_vq.train.carry import from_plain, to_plain
from transformer_vq.train.checkpoint import save_checkpoint, save_sharded_checkpoint, step_name
from transformer_vq.train.finite import nonfinite_names
from transformer_vq.train.distributed import Distributed, data_parallel, setup_distributed, teardown_distributed
from transformer_vq.train.evaluate import EvalResult, evaluate_tokens
from transformer_vq.train.fsdp import nonfinite_shards, shard_model, to_float
from transformer_vq.train.guard import TrainingError, nonfinite_weights_error, skip_reason, too_many_skipped_error
from transformer_vq.train.metrics import MetricsLogger, finite_or_none
from transformer_vq.train.optim import build_optimizer, build_scheduler
from transformer_vq.train.objective import masked_window
from transformer_vq.train.resume import checkpoint_to_resume, refuse_fresh_over_checkpoints
from transformer_vq.train.rng import rng_state, set_rng_state
from transformer_vq.train.rundir import hold_run_dir, writing
from transformer_vq.train.sample import stream_text
from transformer_vq.train.signals import StopRequest


@dataclass
class TrainResult:
    """How a call to :func:`train` ended."""

    run_dir: Path
    step: int
    """Optimizer steps done (including steps from before a resume)."""
    exit_code: int
    """0 when all steps ran; 128 + signal number when stopped by SIGTERM (143) or SIGINT (130)."""
    validation: EvalResult | None = None
    sample: str | None = None
    tokens_per_s: float | None = None
    """Training tokens per second over this call's steps (all workers together)."""


def train(cfg: RunConfig, *, resume: str | None = None, model: torch.nn.Module | None = None,
          _skip_restore: frozenset = frozenset()) -> TrainResult:
    """Train a model as ``cfg`` says; the Python form of ``tvq train``.

    Args:
        cfg: model and training configuration.
        resume: ``None`` to start a new run (refused when the run directory already has checkpoints),
            ``"auto"`` to continue from the run directory's latest complete checkpoint when there is one,
            or the path of a run or checkpoint directory to continue from.
        model: train this module instead of the one ``cfg`` describes (``TransformerVQ(cfg.model)``, or
            ``LongVQLM(cfg.model)`` for arch ``longvq``; same interface).
        _skip_restore: for tests only: parts of a checkpoint ({"data", "rng"}) *not* to restore, to
            show that restoring them is what makes resumed training identical.

    Returns a :class:`TrainResult`; raises :class:`TrainingError`, :class:`CheckpointError` (its subclass
    ``RunDirError`` when the run directory is unusable or in use by another training) or the data
    layer's ``DataError`` with a message for the user.
    """
    device = training_device(cfg.train)
    dist_info = setup_distributed(device.type, cfg.train.parallel)
    if device.type == "cuda":
        device = torch.device("cuda", dist_info.local_rank)
    try:
        # locked before anything slow (loading the corpus): a second training is refused at once
        with hold_run_dir(cfg.train.resolved_run_dir(), dist_info):
            result = _Trainer(cfg, dist_info, device, model).run(resume, _skip_restore)
        # no worker tears its process group down while another still talks to it (a gloo worker that left
        # early was once seen to abort at exit, in CI)
        dist_info.barrier()
        return result
    finally:
        teardown_distributed(dist_info)


class _Trainer:
    """The state of one training run; :meth:`run` is the loop."""

    def __init__(self, cfg: RunConfig, dist_info: Distributed, device: torch.device, model):
        self.cfg = cfg
        self.tc = tc = cfg.train
        self.dist = dist_info
        self.device = device
        self.run_dir = tc.resolved_run_dir()
        self.ckpt_root = self.run_dir / "checkpoints"
        self.log = print if dist_info.is_main else (lambda *a, **k: None)

        self.corpus = load_corpus_for(tc)
        for split in ("train", "validation"):
            check_vocab(self.corpus.split(split), cfg.model.vocab_size, split)
        self.batches = corpus_batches(self.corpus, "train", batch_size=tc.batch_size, seq_len=tc.seq_len,
                                      seed=tc.seed, rank=dist_info.rank, world_size=dist_info.world_size)

        torch.manual_seed(tc.seed)  # identical initial weights on every worker
        self.model = (model if model is not None else build_model(cfg)).to(device)
        self.model.train()
        if dist_info.fsdp:
            shard_model(self.model, tc.precision)  # before the optimizer: its parameters become the shards
        if tc.torch_compile:
            compile_units(self.model)  # after sharding, as FSDP2 asks; the weights and checkpoints stay the same
        self.optimizer = build_optimizer(self.model, tc)
        self.scheduler = build_scheduler(self.optimizer, tc)
        # dropout differs between workers, as their data does
        torch.manual_seed(tc.seed * 1_000_003 + 1 + dist_info.rank)
        # LayerDrop (Transformer-VQ's droplyr) leaves a skipped unit's parameters without gradients
        find_unused = getattr(cfg.model, "droplyr", 0.0) > 0
        self.forward = data_parallel(self.model, dist_info, device, find_unused=find_unused)
        self.step = 0
        self.batch = None  # (B_local, seq_len + 1) the current batch of sequences
        self.batch_pos = self.batches.state_dict()  # data position before the current batch
        self.carry = None  # operator state carried into the next window
        self.nonfinite_run = 0
        self.skip_reason: str | None = None  # why the last step was skipped
        self.train_tokens_per_byte = corpus_tokens_per_byte(self.corpus, "train")

    # ---- checkpoints -------------------------------------------------------------------------------

    def _checkpoint_state(self) -> dict:
        mid_batch = self.step % self.tc.windows_per_batch != 0
        return {
            **({} if self.dist.fsdp else {"optimizer": self.optimizer.state_dict()}),  # FSDP: in the shards
            "scheduler": self.scheduler.state_dict(),
            # mid-batch: where the current batch starts (the carried states are saved beside it)
            "data": self.batch_pos if mid_batch else self.batches.state_dict(),
            "nonfinite_run": self.nonfinite_run,
            "world_size": self.dist.world_size,
        }

    def save(self) -> None:
        # every worker's generators and carried state (its own rows of the batch), in rank order
        mid_batch = self.step % self.tc.windows_per_batch != 0
        rngs = self.dist.all_gather_object(rng_state())
        carries = self.dist.all_gather_object(to_plain(self.carry) if mid_batch else None)
        if self.dist.is_main or self.dist.fsdp:  # FSDP: every worker writes its shards
            state = {**self._checkpoint_state(), "rng": rngs, "carry": carries}
            with writing(self.run_dir, f"save checkpoint {step_name(self.step)}"):
                common = {"step": self.step, "model": self.model, "config": self.cfg.to_dict(), "state": state,
                          "keep": self.tc.keep_ckpts}
                path = save_sharded_checkpoint(
                    self.ckpt_root, optimizer=self.optimizer, dist_info=self.dist, **common,
                    nonfinite_shards=lambda named: nonfinite_shards(named, self.dist, self.device),
                ) if self.dist.fsdp else save_checkpoint(self.ckpt_root, **common)
            self.log(f"saved checkpoint {path}", flush=True)
        self.dist.barrier()

    def restore(self, resume: str, skip: frozenset) -> None:
        ckpt = checkpoint_to_resume(self.ckpt_root, resume, self.log)
        if ckpt is None:
            return
        state = ckpt.state
        ckpt.load_training_state(self.model, self.optimizer, sharded=self.dist.fsdp)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = ckpt.step
        self.nonfinite_run = int(state["nonfinite_run"])
        if "data" not in skip:
            self.batches.load_state_dict(state["data"])
        if "rng" not in skip:
            if len(state["rng"]) == self.dist.world_size:
                set_rng_state(state["rng"][self.dist.rank])
            else:
                self.log(f"warning: the checkpoint was saved by {len(state['rng'])} workers, this run has "
                         f"{self.dist.world_size}: random streams (dropout) restart from new seeds")
                torch.manual_seed(self.cfg.train.seed * 1_000_003 + 1 + self.dist.rank + 7919 * self.step)
        if self.step % self.tc.windows_per_batch != 0:
            self.batch_pos = self.batches.state_dict()
            self.batch = next(self.batches).to(self.device)
            if "data" in skip:
                self.carry = None
            elif len(state["carry"]) == self.dist.world_size:
                self.carry = from_plain(state["carry"][self.dist.rank], self.device)
            else:
                # each worker's state covers its own rows of the batch, which change with the worker count
                self.log(f"warning: the checkpoint falls mid-batch and was saved by {len(state['carry'])} workers, "
                         f"this run has {self.dist.world_size}: the rest of this batch starts without context")
                self.carry = None
        self.log(f"resumed from {ckpt.path} at step {self.step}")

    # ---- one step ------------------------------------------------------------------------------------

    def train_step(self, stop: StopRequest) -> dict:
        """One optimizer step on the next window; returns its metrics (identical on every worker)."""
        tc = self.tc
        inputs, targets = self._next_window()  # (B_local, update_len) each
        loss_mask = None
        if not self.cfg.model.causal:  # an encoder predicts masked tokens of its window instead
            inputs, targets, loss_mask = masked_window(inputs, cfg=self.cfg.model, seed=tc.seed, step=self.step,
                                                       rank=self.dist.rank)
        begin = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=tc.precision == "bfloat16"):
            out = self.forward(inputs, state=self.carry, targets=targets, loss_mask=loss_mask)
        out.loss.backward()
        max_norm = tc.grad_clip if tc.optimizer == "adamw" and tc.grad_clip > 0 else math.inf
        # over FSDP's sharded gradients the norm is a DTensor reduced over every worker: the global norm
        grad_norm = to_float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        # one collective for the logged losses and the flags every worker must agree on
        shared = torch.tensor([out.loss.item(), out.ce_loss.item(), out.commit_loss.item(),
                               float(not math.isfinite(out.loss.item())), float(stop.signum is not None)],
                              dtype=torch.float64, device=self.device)  # nccl reduces only GPU tensors
        self.dist.all_reduce_sum_([shared])
        loss, ce_loss, commit_loss = (shared[:3] / self.dist.world_size).tolist()
        lr = self.scheduler.get_last_lr()[0]
        self.skip_reason = skip_reason(shared[3].item() == 0, grad_norm, self.scheduler.get_last_lr())
        self._update(lr) if self.skip_reason is None else self._skip()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.carry = None if out.state is None else out.state.detach()
        self.step += 1
        seconds = time.perf_counter() - begin
        metrics = {
            "step": self.step, "loss": finite_or_none(loss), "ce_loss": finite_or_none(ce_loss),
            "commit_loss": finite_or_none(commit_loss),
            "bits_per_byte": finite_or_none(bits_per_byte(ce_loss, self.train_tokens_per_byte)),
            "lr": lr, "grad_norm": finite_or_none(grad_norm),
            "tokens": tc.batch_size * tc.update_len, "seconds": seconds,
            "tokens_per_s": tc.batch_size * tc.update_len / seconds, "skipped": self.skip_reason is not None,
            **self.model.codebook_metrics(),
        }
        return {"metrics": metrics, "stop": shared[4].item() > 0}

    def _next_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the next window, starting a new batch (and a fresh state) when due."""
        window = self.step % self.tc.windows_per_batch
        if window == 0:
            self.batch_pos = self.batches.state_dict()
            self.batch = next(self.batches).to(self.device)
            self.carry = None
        lo, update_len = window * self.tc.update_len, self.tc.update_len
        return self.batch[:, lo:lo + update_len], self.batch[:, lo + 1:lo + update_len + 1]

    def _update(self, lr: float) -> None:
        """Apply the step: weights, then the codebooks from every worker's statistics."""
        self.optimizer.step()
        bad = nonfinite_shards(self.model.named_parameters(), self.dist, self.device) if self.dist.fsdp \
            else nonfinite_names(self.model.named_parameters())
        if bad:  # identical weights on every worker: all of them stop here
            raise nonfinite_weights_error(self.step + 1, bad, lr)
        stats = self.model.codebook_stats()
        self.dist.all_reduce_sum_(stats)
        self.model.update_codebooks()
        self.nonfinite_run = 0

    def _skip(self) -> None:
        """Skip the step: weights, optimizer and codebooks untouched (the statistics are discarded)."""
        self.model.reset_codebook_stats()
        self.nonfinite_run += 1

    # ---- the loop ------------------------------------------------------------------------------------

    def evaluate(self, max_tokens: int) -> EvalResult:
        return evaluate_tokens(
            self.model, self.corpus.split("validation"), window_len=self.tc.seq_len,
            tokens_per_byte=corpus_tokens_per_byte(self.corpus, "validation"),
            tokens_per_word=corpus_tokens_per_word(self.corpus, "validation"), streams=self.tc.eval_streams,
            max_tokens=max_tokens, precision=self.tc.precision, progress=False,
        )

    def run(self, resume: str | None, skip: frozenset) -> TrainResult:
        self._start(resume, skip)
        logger = None
        if self.dist.is_main:
            with writing(self.run_dir, "open metrics.jsonl and tb/"):
                logger = MetricsLogger(self.run_dir, total_steps=self.tc.steps, start_step=self.step,
                                       log_every=self.tc.log_every)
        validation = sample_text = None
        try:
            exit_code = self._loop(logger)
            if exit_code == 0 and self.evaluates:
                validation, sample_text = self._finish(logger)
                if not self.dist.is_main:  # the result of a run is rank 0's, as under DDP
                    validation = sample_text = None
        finally:
            if logger:
                logger.close()
        return TrainResult(run_dir=self.run_dir, step=self.step, exit_code=exit_code, validation=validation,
                           sample=sample_text, tokens_per_s=logger.tokens_per_s if logger else None)

    def _start(self, resume: str | None, skip: frozenset) -> None:
        """Check the run directory, restore a checkpoint, and record the run's config (main process)."""
        if self.dist.is_main:
            # temporary directories of killed saves, checkpoints whose pruning was killed midway
            fileio.clean_debris(self.ckpt_root)
        refuse_fresh_over_checkpoints(self.ckpt_root, self.run_dir, resume)
        if resume is not None:
            self.restore(resume, skip)
        if not self.dist.is_main:
            return
        with writing(self.run_dir, "write the run's config.json"):
            fileio.atomic_write_text(self.run_dir / "config.json", self.cfg.to_json())
            save_run_tokenizer(self.corpus, self.run_dir)
        tc = self.tc
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"training a {n_params / 1e6:.2f}M-parameter model on {self.corpus.name} "
                 f"({len(self.corpus.split('train')):,} training tokens) for {tc.steps} steps of "
                 f"{tc.batch_size} x {tc.update_len} tokens on {self.dist.world_size} x {self.device.type}; "
                 f"run directory {self.run_dir}", flush=True)

    def _loop(self, logger: MetricsLogger | None) -> int:
        """Train until ``steps`` (returns 0) or a stop signal (returns 128 + its number), saving as configured."""
        tc = self.tc
        with StopRequest() as stop:
            while self.step < tc.steps:
                result = self.train_step(stop)
                if logger:
                    self._log_step(logger, result["metrics"])
                if self.nonfinite_run >= tc.max_nonfinite:
                    self.save()
                    raise too_many_skipped_error(self.step, self.nonfinite_run, self.skip_reason, tc.max_nonfinite)
                if result["stop"]:
                    self.save()
                    return 128 + (stop.signum or signal.SIGTERM)
                if self.step % tc.ckpt_every == 0 or self.step == tc.steps:
                    self.save()
                if tc.eval_every and self.step % tc.eval_every == 0 and self.step < tc.steps:
                    if self.evaluates:
                        self._log_eval(logger, self.evaluate(tc.eval_tokens))
                    self.dist.barrier()
        return 0

    def _log_step(self, logger: MetricsLogger, metrics: dict) -> None:
        with writing(self.run_dir, "write metrics.jsonl"):
            logger.log_step(metrics)
        if metrics["skipped"]:
            logger.print(f"step {self.step}: non-finite {self.skip_reason}, step skipped "
                         f"({self.nonfinite_run} in a row)")

    @property
    def evaluates(self) -> bool:
        """Whether this worker evaluates and samples: rank 0, or under FSDP every worker (each forward
        gathers the shards of all of them; they compute the same result, rank 0 logs it)."""
        return self.dist.is_main or self.dist.fsdp

    def _log_eval(self, logger: MetricsLogger | None, result: EvalResult) -> None:
        if logger is None:
            return
        with writing(self.run_dir, "write metrics.jsonl"):
            logger.log_eval(self.step, "validation", result.to_dict())

    def _finish(self, logger: MetricsLogger | None) -> tuple[EvalResult, str | None]:
        """The end-of-training validation and sample (see :attr:`evaluates`)."""
        validation = self.evaluate(self.tc.eval_tokens)
        self._log_eval(logger, validation)
        sample = self.tc.sample_tokens and self.cfg.model.causal  # an encoder cannot sample
        return validation, self._sample(logger) if sample else None

    def _sample(self, logger: MetricsLogger | None) -> str:
        prompt = self.tc.sample_prompt
        pieces = stream_text(self.model, self.corpus.encode(prompt), self.corpus.decode,
                             max_new_tokens=self.tc.sample_tokens, seed=self.tc.seed)
        text = "".join(pieces)
        if logger:
            logger.print(f"sample ({self.tc.sample_tokens} tokens, prompt {json.dumps(prompt)}):\n"
                         f"{prompt}{text}")
        return text
