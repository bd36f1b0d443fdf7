"""Evaluation: loss and bits per byte of a split, the operator state carried across the whole split.

Like the paper, a split is read as one long sequence: every token is predicted from everything
before it, through the compressed cache, however far back. To use a batch, the split can be cut
into ``streams`` contiguous pieces evaluated side by side (each carrying its own state); with
``streams=1`` it is exactly one sequence.

The metrics are computed by :mod:`transformer_vq.data.metrics`. Bits per byte: the mean
next-token loss in bits times tokens per byte of the split,
``bpb = mean_nll / ln 2 * n_tokens / n_bytes``. For byte-level data ``n_tokens = n_bytes``, so a
model with uniform logits over 256 bytes scores exactly 8 bits per byte. For tokenized text
(PG-19) ``n_bytes`` is the UTF-8 byte count of the original text (``corpus.split_bytes``), so the
number is comparable across tokenizers.

An encoder (``causal=False``) is evaluated by its training objective instead (:mod:`transformer_vq.train.objective`):
the split is cut into independent windows of ``window_len`` tokens (its context: unlike a causal model's, its score
depends on the window length), a fixed ``mask_rate`` of each window's tokens is masked by a generator seeded by the
window's index (so ``streams``, the windows per forward call, changes nothing), and the loss is the mean
cross-entropy of the masked tokens (bits per masked byte). It carries no state: :func:`evaluate` refuses
``carry_tokens``.

Word-level perplexity (PG-19, Rae et al. 2020), when the corpus counts the whitespace-separated
words of the original split text (``corpus.metadata["split_words"]``):
``exp(total NLL nats / n_words) = exp(mean_nll * n_tokens / n_words)``; a model with uniform
logits over V tokens scores ``V ** (n_tokens / n_words)``.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from transformer_vq.config import ConfigError, EvalConfig
from transformer_vq.config.jobs import job_config
from transformer_vq.data.batches import check_vocab
from transformer_vq.data.metrics import (bits_per_byte, bpb_unit, corpus_tokens_per_byte, corpus_tokens_per_word,
                                         word_perplexity)
from transformer_vq.data.progress import on_terminal
from transformer_vq.data.recall import spec_of
from transformer_vq.train.checkpoint.store import run_dir_of
from transformer_vq.train.device import use_threads
from transformer_vq.nn.inference import evaluating
from transformer_vq.train.lm.build import load_corpus_for, model_from_checkpoint, other_corpus_note
from transformer_vq.train.lm.objective import mask_generator, mask_tokens
from transformer_vq.train.lm.recall import recall_accuracy


@dataclass
class EvalResult:
    """What :func:`evaluate_tokens` measured."""

    split: str
    loss: float
    """Mean next-token cross-entropy in nats (an encoder's: of the masked tokens)."""
    bits_per_byte: float
    tokens: int
    """Number of predicted tokens (an encoder's: masked tokens)."""
    seconds: float
    tokens_per_s: float
    word_perplexity: float | None = None
    """Word-level perplexity, for corpora that count the words of their original text (PG-19); else None."""
    objective: str = "next-token"
    """What was predicted: 'next-token' (causal models) or 'masked-token' (encoders)."""
    carry_tokens: int = 0
    """The state was reset every this many tokens of a stream (0: carried across each whole stream; an encoder reads
    independent windows and carries none)."""
    recall: dict | None = None
    """On the recall probe (``--data recall``): answer accuracy by distance, a
    :meth:`~transformer_vq.train.recall.RecallResult.to_dict`; else None."""

    @property
    def unit(self) -> str:
        """What ``bits_per_byte`` counts, for messages: 'bits per byte' or 'bits per masked byte'."""
        return bpb_unit(self.objective)

    def to_dict(self) -> dict:
        """The fields as a dict; ``recall`` only on the recall probe."""
        values = asdict(self)
        if values["recall"] is None:
            del values["recall"]
        return values


def evaluate_tokens(model: torch.nn.Module, tokens: np.ndarray, *, window_len: int, tokens_per_byte: float = 1.0,
                    streams: int = 1, max_tokens: int = 0, precision: str = "float32", split: str = "validation",
                    progress: bool | None = None, tokens_per_word: float | None = None,
                    carry_tokens: int = 0) -> EvalResult:
    """Evaluate ``model`` on a flat token array.

    Args:
        model: a model called as ``model(input_ids, state=state)`` returning ``.logits`` and ``.state``.
        tokens: 1-D token ids of the split.
        window_len: tokens per forward call. A causal model: memory only (the carried state makes the result
            independent of it up to float rounding); an encoder: the context each window is read with.
        tokens_per_byte: tokens of the whole split divided by its bytes (1 for byte-level data).
        streams: contiguous pieces evaluated as one batch (an encoder: windows per forward call).
        max_tokens: evaluate only the first this many tokens (0 = all).
        precision: 'float32' or 'bfloat16' autocast.
        progress: show a progress bar (default: when stderr is a terminal).
        tokens_per_word: tokens of the whole split divided by the whitespace-separated words of its
            original text; given, the result has a word-level perplexity.
        carry_tokens: reset the state every this many tokens of a stream (a multiple of ``window_len``; 0 = carry
            it across the whole stream: how the model extrapolates). ``tvq eval`` and :func:`evaluate` pass the
            run's ``seq_len``, as the authors' evaluation does (a fresh state every sequence). An encoder carries no
            state: ignored.
    """
    if max_tokens:
        tokens = tokens[:max_tokens]
    n_pred = len(tokens) - 1
    if n_pred < 1:
        raise ValueError(f"the {split} split has {len(tokens)} tokens; evaluation needs at least 2")
    device = next(model.parameters()).device
    encoder = getattr(model, "cfg", None) is not None and not model.cfg.causal
    begin = time.perf_counter()
    with evaluating(model):
        if encoder:
            total_nll, n_pred = _masked_nll(model, tokens, window_len, streams, precision, _progress(split, progress))
        else:
            rows, mask = stream_rows(tokens, n_pred, streams, device, align=carry_tokens)
            total_nll = _total_nll(model, rows, mask, window_len, precision, _progress(split, progress),
                                   carry_tokens)
    seconds = time.perf_counter() - begin
    loss = total_nll / n_pred
    return EvalResult(split=split, loss=loss, bits_per_byte=bits_per_byte(loss, tokens_per_byte), tokens=n_pred,
                      seconds=seconds, tokens_per_s=n_pred / max(seconds, 1e-9),
                      word_perplexity=None if tokens_per_word is None else word_perplexity(loss, tokens_per_word),
                      objective="masked-token" if encoder else "next-token",
                      carry_tokens=0 if encoder else carry_tokens)


def stream_rows(tokens: np.ndarray, n_pred: int, streams: int, device,
                align: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, mask)``: ``(streams, piece + 1)`` token rows, where stream s predicts
    ``tokens[s*piece + 1 : (s+1)*piece + 1]``, and the ``(streams, piece)`` mask of real predictions
    (the last stream is padded, and its padded positions are masked out of the loss).

    ``align`` > 0 (the state's reset, ``carry_tokens``): ``piece`` is a multiple of it, so every stream starts, and
    resets its state, where one of the split's sequences begins (fewer streams where the split is short). A stream
    starting inside one restarted its state and absolute positions there: an image scored as two halves, the
    result depending on ``streams``."""
    streams = max(1, min(streams, n_pred))  # no empty stream
    piece = math.ceil(n_pred / streams)
    if align:
        piece = math.ceil(piece / align) * align
        streams = math.ceil(n_pred / piece)
    rows = np.zeros((streams, piece + 1), dtype=np.int64)
    mask = np.zeros((streams, piece), dtype=bool)
    for s in range(streams):
        chunk = np.asarray(tokens[s * piece: min((s + 1) * piece, n_pred) + 1], dtype=np.int64)
        rows[s, :len(chunk)] = chunk
        mask[s, :len(chunk) - 1] = True
    return torch.from_numpy(rows).to(device), torch.from_numpy(mask).to(device)


def _progress(split: str, progress: bool | None):
    """Wraps the window starts in a progress bar when asked (default: when stderr is a terminal)."""
    if progress is None:
        progress = on_terminal()
    if not progress:
        return lambda starts: starts
    from tqdm import tqdm

    return lambda starts: tqdm(starts, desc=f"eval {split}", unit="window", leave=False)


def window_nll(model: torch.nn.Module, rows: torch.Tensor, mask: torch.Tensor, window_len: int, precision: str,
               progress, carry_tokens: int = 0):
    """Yields ``(start, nll, real)`` per window of the streams: the ``(streams, w)`` per-token NLL in nats (float32
    whatever the autocast dtype) of the predictions ``start .. start + w`` and which of them are real.

    The state is carried from window to window; ``carry_tokens`` > 0 resets it every that many tokens (a multiple of
    ``window_len``), so that no prediction sees more history than that: the context a model was trained with.
    """
    if carry_tokens % window_len:
        lower, upper = carry_tokens // window_len * window_len, (carry_tokens // window_len + 1) * window_len
        nearest = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(f"--carry-tokens {carry_tokens} is not a multiple of the window length {window_len} "
                         f"(--window-len; by default the run's update_len): give {nearest}, or a --window-len that "
                         f"divides {carry_tokens}")
    device = rows.device
    piece = mask.shape[1]
    state = None
    for start in progress(range(0, piece, window_len)):
        if carry_tokens and start % carry_tokens == 0:
            state = None
        end = min(start + window_len, piece)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            out = model(rows[:, start:end], state=state)
        state = out.state
        yield start, F.cross_entropy(out.logits.float().transpose(1, 2), rows[:, start + 1:end + 1],
                                     reduction="none"), mask[:, start:end]


def _total_nll(model: torch.nn.Module, rows: torch.Tensor, mask: torch.Tensor, window_len: int, precision: str,
               progress, carry_tokens: int = 0) -> float:
    """Summed NLL in nats of the masked predictions, the state carried from window to window (reset every
    ``carry_tokens`` when > 0)."""
    total_nll = torch.zeros((), dtype=torch.float64, device=rows.device)
    for _, nll, real in window_nll(model, rows, mask, window_len, precision, progress, carry_tokens):
        total_nll += nll[real].sum(dtype=torch.float64)
    return total_nll.item()


def _masked_nll(model: torch.nn.Module, tokens: np.ndarray, window_len: int, streams: int, precision: str,
                progress) -> tuple[float, int]:
    """An encoder's summed NLL in nats of its masked tokens, and their number: independent windows of
    ``window_len`` tokens, ``streams`` of them per forward call, each masked by a generator seeded by its index."""
    device = next(model.parameters()).device
    n_windows = math.ceil(len(tokens) / window_len)
    rows = np.zeros((n_windows, window_len), dtype=np.int64)
    real = np.zeros((n_windows, window_len), dtype=bool)
    flat = np.asarray(tokens, dtype=np.int64)
    rows.reshape(-1)[:len(flat)], real.reshape(-1)[:len(flat)] = flat, True
    rows_t, real_t = torch.from_numpy(rows), torch.from_numpy(real)
    total_nll, n_masked = torch.zeros((), dtype=torch.float64), 0
    batch = max(1, streams)
    for start in progress(range(0, n_windows, batch)):
        ids, is_real = rows_t[start:start + batch], real_t[start:start + batch]
        inputs, masked = _window_masks(ids, is_real, start, model.cfg)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            out = model(inputs.to(device), mask=is_real.to(device))
        nll = F.cross_entropy(out.logits.float().transpose(1, 2), ids.to(device), reduction="none")
        total_nll += nll[masked.to(device)].sum(dtype=torch.float64).cpu()
        n_masked += int(masked.sum())
    return total_nll.item(), n_masked


def _window_masks(ids: torch.Tensor, real: torch.Tensor, first: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, masked)`` of the ``(n, window_len)`` windows ``first .. first + n`` of the split: each window
    masked by its own generator, seeded by its index alone, so that how the windows are batched (``streams``)
    cannot change which tokens are masked."""
    pairs = [mask_tokens(ids[i:i + 1], mask_rate=cfg.mask_rate, mask_token_id=cfg.mask_token_id,
                         generator=mask_generator(0, first + i), real=real[i:i + 1]) for i in range(len(ids))]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


def trained_history(seq_len: int, window_len: int) -> int:
    """The default reset of evaluation: every ``seq_len`` tokens, the history a model was trained with (its state is
    reset at the start of every training sequence), as the authors' evaluation does (``eval_op`` scans one sequence
    of ``sequence_len`` from a fresh state). Carried further, a model meets caches larger than any training showed:
    docs/quality.md, "Why the cache hurt"."""
    if seq_len % window_len:
        raise ValueError(f"--window-len {window_len} does not divide the run's seq_len {seq_len}, where evaluation "
                         f"resets the state by default (the history the model was trained with): give a --window-len "
                         f"that divides {seq_len}, or --carry-tokens (a multiple of {window_len}; 0 = the whole "
                         f"stream)")
    return seq_len


def _carry_tokens(cfg: EvalConfig, run_cfg, window_len: int) -> int:
    """The state reset of ``tvq eval``: ``--carry-tokens`` as given, else the history the model was trained with
    (:func:`trained_history`). An encoder carries no state, so the option would change nothing: refused."""
    if run_cfg.model.causal:
        return trained_history(run_cfg.train.seq_len, window_len) if cfg.carry_tokens is None else cfg.carry_tokens
    if cfg.carry_tokens is not None:
        raise ConfigError("carry_tokens does not apply to an encoder", [(
            "carry_tokens", f"applies only to causal models, and {cfg.ckpt} holds an encoder (causal false), which "
                            f"reads independent windows and carries no state to reset, got {cfg.carry_tokens}; leave "
                            f"it out (--window-len sets an encoder's context)")], EvalConfig)
    return 0


def evaluate(ckpt: str | EvalConfig, **options) -> EvalResult:
    """Evaluate a checkpoint (a run directory or a checkpoint directory) on a split of its corpus.

    ``ckpt`` is an :class:`~transformer_vq.config.EvalConfig`, or a checkpoint path with the other
    EvalConfig fields as keywords (``evaluate("runs/default", split="test", max_tokens=10_000)``).
    The corpus (with its saved loader options, and the run's copy of its tokenizer), model and
    precision come from the checkpoint's saved config; ``data_path`` replaces the saved data path
    (for data that moved) and ``data_options`` override saved loader options.
    """
    cfg = job_config(EvalConfig, ckpt, **options)
    use_threads(cfg.threads)
    split = cfg.split
    model, run_cfg, checkpoint = model_from_checkpoint(cfg.ckpt, device=cfg.device)
    window_len, streams = cfg.window_len or run_cfg.train.update_len, cfg.streams or run_cfg.train.eval_streams
    carry_tokens = _carry_tokens(cfg, run_cfg, window_len)  # refused before the corpus is read
    corpus = load_corpus_for(run_cfg.train, data_path=cfg.data_path, run_dir=run_dir_of(checkpoint),
                             data_options=cfg.data_options)
    if note := other_corpus_note(checkpoint, corpus, cfg.data_path, cfg.data_options):
        print(note, file=sys.stderr)
    tokens = corpus.split(split)
    check_vocab(tokens, run_cfg.model.vocab_size, split)
    result = evaluate_tokens(
        model, tokens, window_len=window_len, tokens_per_byte=corpus_tokens_per_byte(corpus, split),
        tokens_per_word=corpus_tokens_per_word(corpus, split), streams=streams, max_tokens=cfg.max_tokens,
        precision=run_cfg.train.precision, split=split, carry_tokens=carry_tokens,
    )
    if spec_of(corpus) is not None:  # the memory probe: its answers, episode by episode, by distance
        max_episodes = -(-cfg.max_tokens // spec_of(corpus).seq_len) if cfg.max_tokens else 0
        result.recall = recall_accuracy(model, corpus, split, block_len=run_cfg.model.block_len, window_len=window_len,
                                        batch_size=streams, max_episodes=max_episodes).to_dict()
    return result
