"""Language-model training (Sec. 3.4): truncated backprop through time over windows of ``update_len`` tokens, one
optimizer step and one codebook EMA update per window, on the engine of :mod:`transformer_vq.train.trainer`.

Per batch of ``[B, seq_len + 1]`` token windows::

    state = None                                   # reset at every new batch of sequences
    for each window w of update_len tokens:        # seq_len / update_len optimizer steps
        out = model(x_w, state, targets=y_w)       # loss = CE + beta * commit loss
        (the engine's guarded step: DDP or FSDP averages gradients, clip, apply or skip)
        state = out.state.detach()                 # carried to the next window, no gradient

Fault tolerance: checkpoints every ``ckpt_every`` steps (atomic, see train/checkpoint) hold everything needed to
continue bit for bit on CPU: weights, codebooks, optimizer, scheduler, step, data position, every worker's RNG states
and, mid-batch, the carried operator state. SIGTERM / SIGINT finish the current step, save, and make :func:`train`
return exit code 143 / 130.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from transformer_vq.config import ConfigError, RunConfig
from transformer_vq.data.batches import check_decodable, check_vocab, corpus_batches, packed_documents
from transformer_vq.data.corpus import corpus_fingerprint
from transformer_vq.data.metrics import bits_per_byte, corpus_tokens_per_byte, corpus_tokens_per_word
from transformer_vq.train.checkpoint.resume import check_resume, check_same_data, refuse_over_checkpoints_of
from transformer_vq.train.checkpoint.rundir import hold_run_dir
from transformer_vq.train.device import training_device
from transformer_vq.train.fits import check_fits
from transformer_vq.train.lm.build import (build_model, check_corpus_options, check_documents_used, load_corpus_for,
                                          save_run_tokenizer)
from transformer_vq.train.lm.carry import all_finite, from_plain, plain_rows, to_plain
from transformer_vq.train.lm.evaluate import EvalResult, evaluate_tokens, trained_history
from transformer_vq.train.lm.objective import masked_window
from transformer_vq.train.lm.sample import is_image_run, stream_text
from transformer_vq.train.parallel.distributed import (Distributed, check_workers_of, setup_distributed,
                                                     teardown_distributed)
from transformer_vq.train.metrics import finite_or_none
from transformer_vq.train.signals import release_signals
from transformer_vq.train.trainer import RunResult, Step, Trainer


@dataclass
class TrainResult(RunResult):
    """How a call to :func:`train` ended; ``validation`` is an :class:`EvalResult`."""

    sample: str | None = None
    """The end-of-training sample."""
    compile_steps: int = 0
    """Steps of this call that compiled a graph (``torch_compile``), left out of ``tokens_per_s`` (rank 0's)."""
    compile_seconds: float = 0.0
    """Their time: mostly compilation."""


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
    check_corpus_options(cfg.train)
    # before the corpus and the model are read
    resumed = check_resume(cfg.train.resolved_run_dir(), resume, cfg.train) is not None
    check_documents_used(cfg.train)
    check_workers_of(cfg.train, resumed)
    device = training_device(cfg.train)
    dist_info = setup_distributed(device.type, cfg.train.parallel, cfg.train.context_parallel,
                                  cfg.train.collective_timeout)
    if device.type == "cuda":
        device = torch.device("cuda", dist_info.local_rank)
    trainer = None
    try:
        # a model whose training cannot fit is refused before the run directory or the corpus is touched
        check_fits(lambda: trained_model(cfg, model), cfg.train.optimizer, device, dist_info.world_size,
                   dist_info.fsdp)
        # locked before anything slow (loading the corpus): a second training is refused at once
        with hold_run_dir(cfg.train.resolved_run_dir(), dist_info):
            refuse_over_checkpoints_of(cfg.train.resolved_run_dir(), resume)  # before the data is read
            trainer = LMTrainer(cfg, dist_info, device, model)
            exit_code = trainer.run(resume, _skip_restore)
        # no worker tears its process group down while another still talks to it (a gloo worker that left
        # early was once seen to abort at exit, in CI)
        dist_info.barrier()
        done = exit_code == 0 and dist_info.is_main  # the result of a run is rank 0's, as under DDP
        return TrainResult(run_dir=trainer.run_dir, step=trainer.step, exit_code=exit_code,
                           validation=trainer.validation if done else None, sample=trainer.sample if done else None,
                           tokens_per_s=trainer.tokens_per_s, **compile_times(trainer.logger))
    finally:
        try:
            if trainer is not None:  # on the way out of an error too: a traceback keeps the trainer alive
                trainer.release_data_parallel()
            teardown_distributed(dist_info)
        finally:
            release_signals()  # held since a failed training loop: see hold_signals


def compile_times(logger) -> dict:
    """The compile fields of a :class:`TrainResult` (zero without a logger: workers but rank 0)."""
    if logger is None:
        return {}
    return {"compile_steps": logger.compile_steps, "compile_seconds": logger.compile_seconds}


def trained_model(cfg: RunConfig, model: torch.nn.Module | None) -> torch.nn.Module:
    """The model a run trains: the caller's ``model``, else the one ``cfg`` describes."""
    return model if model is not None else build_model(cfg)


class LMTrainer(Trainer):
    """The language-model task: windows of a corpus, the operator state carried between them."""

    def __init__(self, cfg: RunConfig, dist_info: Distributed, device: torch.device, model=None):
        tc = cfg.train
        self.corpus = load_corpus_for(tc)
        # what identifies the corpus, saved in every checkpoint and compared on resume (the corpus never changes)
        self.corpus_identity = {**corpus_fingerprint(self.corpus), "data_path": tc.data_path}
        for split in ("train", "validation"):
            check_vocab(self.corpus.split(split), cfg.model.vocab_size, split)
        # an encoder never samples: its larger vocabulary is unused ids, as a causal one's would be
        if cfg.model.causal:
            check_decodable(self.corpus, cfg.model.vocab_size)
        self.batches = corpus_batches(self.corpus, "train", batch_size=tc.batch_size, seq_len=tc.seq_len,
                                      seed=tc.seed, rank=dist_info.data_rank, world_size=dist_info.data_world,
                                      documents=packed_documents(self.corpus, "train") if tc.pack else None)
        super().__init__(cfg, dist_info, device, lambda: trained_model(cfg, model),
                         torch_compile=tc.torch_compile)
        self.batch = None  # (B_local, seq_len + 1) the current batch of sequences
        self.positions = None  # (B_local, seq_len + 1) their positions in their documents (--pack), else None
        self.batch_pos = self.batches.state_dict()  # data position before the current batch
        self.carry = None  # operator state carried into the next window
        self.train_tokens_per_byte = corpus_tokens_per_byte(self.corpus, "train")
        self.sample: str | None = None

    def _mid_batch(self) -> bool:
        return self.step % self.tc.windows_per_batch != 0

    # ---- the step ------------------------------------------------------------------------------------

    def forward_backward(self) -> Step:
        inputs, targets = self._next_window()  # (B_local, update_len) each
        loss_mask, packing = None, {}
        if not self.cfg.model.causal:  # an encoder predicts masked tokens of its window instead
            inputs, targets, loss_mask = masked_window(inputs, cfg=self.cfg.model, seed=self.tc.seed, step=self.step,
                                                       first_row=self.dist.data_rank * inputs.shape[0])
        if self.positions is not None:
            lo = self.step % self.tc.windows_per_batch * self.tc.update_len
            packing = {"position_ids": self.positions[:, lo:lo + inputs.shape[1]]}
            # no loss across a boundary: a document's first token is not predicted from the one before it (the
            # model leaves those inside the window out itself; the last column's, the next window's, only this knows)
            loss_mask = self.positions[:, lo + 1:lo + inputs.shape[1] + 1] != 0
        with self.autocast():
            out = self.forward(inputs, state=self.carry, targets=targets, loss_mask=loss_mask, **packing,
                               **({"context_parallel": self.dist.cp_group} if self.dist.cp_group is not None else {}))
        if packing and self.dist.world_size > 1:
            self._weigh_by_global_targets(out, loss_mask)
        out.loss.backward()
        return Step(output=out, tokens=self.tc.batch_size * self.tc.update_len)

    def _weigh_by_global_targets(self, out, loss_mask: torch.Tensor) -> None:
        """Scale this worker's ``ce_loss`` by its share of the targets of every worker, so that the workers' average
        (DDP's of the gradients, the logged mean) is the mean over every target of the global batch, as one process
        computes it. Packing leaves out a document's first token, so the workers score different numbers of
        targets, and a mean of their means weighed them unequally."""
        counts = loss_mask.sum().to(torch.float64).reshape(1)
        total = counts.clone()
        self.dist.all_reduce_sum_([total])
        share = (counts * self.dist.world_size / total.clamp_min(1)).to(out.ce_loss.dtype).squeeze(0)
        out.loss = out.loss + (share - 1) * out.ce_loss
        out.ce_loss = out.ce_loss * share

    def _next_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the next window, starting a new batch (and a fresh state) when due."""
        window = self.step % self.tc.windows_per_batch
        if window == 0:
            self.batch_pos = self.batches.state_dict()
            self._load_batch()
            self.carry = None
        # with context parallelism, this worker's chunk of the window
        chunk = self.tc.update_len // self.dist.context_parallel
        lo = window * self.tc.update_len + self.dist.cp_rank * chunk
        return self.batch[:, lo:lo + chunk], self.batch[:, lo + 1:lo + chunk + 1]

    def _load_batch(self) -> None:
        batch, positions = self.batches.next_batch()
        self.batch = batch.to(self.device)
        self.positions = None if positions is None else positions.to(self.device)

    def after_step(self, step: Step, ce_loss: float) -> dict:
        state = step.output.state
        self.carry = None if state is None else state.detach()
        if self.skip_reason is not None:  # the same on every worker: the collective below is entered by all
            self._drop_nonfinite_carry()
        return {"bits_per_byte": finite_or_none(bits_per_byte(ce_loss, self.train_tokens_per_byte))}

    def _drop_nonfinite_carry(self) -> None:
        """After a skipped step, drop the carried state if the window left it non-finite on any worker: every later
        window of the batch read it, was non-finite and was skipped too, until the run stopped (``max_nonfinite``),
        and a checkpoint in between saved it, so a resume stopped again. The batch's next windows then start their
        sequences afresh, as at a sequence's start (on every worker: they stay in step)."""
        bad = torch.tensor([float(self.carry is not None and not all_finite(self.carry))], dtype=torch.float64,
                           device=self.device)
        self.dist.all_reduce_sum_([bad])
        if bad.item() > 0:
            self.carry = None
            self.log(f"step {self.step}: the window left the carried attention state non-finite: the batch's next "
                     f"windows start their sequences afresh")

    # ---- checkpoints -------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        # every worker's carried state (its own rows of the batch), in rank order
        carries = self.dist.all_gather_object(to_plain(self.carry) if self._mid_batch() else None)
        # mid-batch: where the current batch starts (the carried states are saved beside it)
        return {"data": self.batch_pos if self._mid_batch() else self.batches.state_dict(), "carry": carries,
                "corpus": self.corpus_identity, "precision": self.tc.precision,
                "context_parallel": self.dist.context_parallel}

    def load_checkpoint_state(self, state: dict, skip: frozenset) -> None:
        if "data" not in skip and "corpus" in state:  # absent from checkpoints of before it was saved
            check_same_corpus(state["corpus"], self.corpus_identity, self.run_dir, packed=self.tc.pack)
        if "data" not in skip:
            self.batches.load_state_dict(state["data"])
        if not self._mid_batch():
            return
        self.batch_pos = self.batches.state_dict()
        self._load_batch()
        carries = state["carry"]
        if "data" in skip:
            self.carry = None
            return
        # the ranks of a "cp" row carry the same state, its rows': one per share of the batch's rows (the context
        # parallelism and the precision are absent from checkpoints of before they were saved: those resume as
        # they were written)
        shares = carries[::state.get("context_parallel", 1)]
        mismatch = self._carry_mismatch(shares, state.get("precision", self.tc.precision))
        if mismatch:
            self.log(f"warning: the checkpoint falls mid-batch and {mismatch}: the rest of this batch starts without "
                     f"context")
        self.carry = None if mismatch else from_plain(shares[self.dist.data_rank], self.device)

    def _carry_mismatch(self, shares: list, precision: str) -> str | None:
        """Why the carried states saved mid-batch cannot continue in this run (None: they can). ``shares``: one state
        per share of the batch's rows, which change with the number of data-parallel workers (not with context
        parallelism, whose ranks carry their share's rows alike), in the precision it was computed in."""
        rows = self.batch.shape[0]
        if len(shares) != self.dist.data_world or plain_rows(shares[self.dist.data_rank]) not in (rows, None):
            saved = len(shares)
            return (f"its carried states were saved for {saved} share{'s' if saved != 1 else ''} of the batch of "
                    f"{plain_rows(shares[0])} rows each; this run has {self.dist.data_world} of {rows}")
        if precision != self.tc.precision:
            return f"its carried states were computed in {precision}; this run computes in {self.tc.precision}"
        return None

    # ---- start, validation and the end -----------------------------------------------------------

    def on_start(self) -> None:
        save_run_tokenizer(self.corpus, self.run_dir)
        self.announce("model", f"{self.corpus.name} ({len(self.corpus.split('train')):,} training tokens)",
                      f"{self.tc.batch_size} x {self.tc.update_len} tokens on {self.dist.world_size} x "
                      f"{self.device.type}" + (f" (context parallel {self.dist.context_parallel})"
                                               if self.dist.context_parallel > 1 else ""))

    def validate(self) -> EvalResult:
        result = evaluate_tokens(
            # windows of update_len, as tvq eval reads them: the state makes the result independent of the window
            # (to rounding), and a window of seq_len tokens on every stream at once held several times the memory
            self.model, self.corpus.split("validation"), window_len=self.tc.update_len,
            tokens_per_byte=corpus_tokens_per_byte(self.corpus, "validation"),
            tokens_per_word=corpus_tokens_per_word(self.corpus, "validation"), streams=self.tc.eval_streams,
            max_tokens=self.tc.eval_tokens, precision=self.tc.precision, progress=False,
            carry_tokens=trained_history(self.tc.seq_len, self.tc.update_len),  # the history it trains with
        )
        self.log_eval(result.to_dict())
        return result

    def finish(self) -> None:
        """The end-of-training sample of text (an encoder cannot sample; an image model's few hundred subpixels
        would not be an image, nor text: ``tvq sample`` writes its PNG files)."""
        if not (self.tc.sample_tokens and self.cfg.model.causal) or is_image_run(self.cfg):
            return
        prompt = self.tc.sample_prompt
        pieces = stream_text(self.model, self.corpus.encode(prompt), self.corpus.decode,
                             max_new_tokens=self.tc.sample_tokens, seed=self.tc.seed)
        self.sample = "".join(pieces)
        if self.logger is not None:
            self.logger.print(f"sample ({self.tc.sample_tokens} tokens, prompt {json.dumps(prompt)}):\n"
                              f"{prompt}{self.sample}")


def check_same_corpus(saved: dict, here: dict, run_dir, packed: bool = False) -> None:
    """Refuse to resume on another corpus than the checkpoint's (``saved`` and ``here``: a
    :func:`corpus_fingerprint` and its ``data_path``; :func:`check_same_data`, which a classifier's dataset shares).
    A run that packs documents (``packed``) keeps their boundaries too (checked where the checkpoint recorded them)."""
    check_same_data(saved, here, run_dir, noun="corpus", unit="tokens")
    if packed and "documents_sha256" in saved and saved["documents_sha256"] != here["documents_sha256"]:
        raise ConfigError(f"--data-path: the run in {run_dir} packs documents (--pack), and this run reads its "
                          f"corpus cut into other documents (the same tokens, other files or lines): its sequences "
                          f"would be packed otherwise from the saved position; resume with the corpus as it was, "
                          f"or start a new run (--run-dir)")
