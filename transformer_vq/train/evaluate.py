"""Evaluation: loss and bits per byte of a split, the operator state carried across the whole split.

Like the paper, a split is read as one long sequence: every token is predicted from everything
before it, through the compressed cache, however far back. To use a batch, the split can be cut
into ``streams`` contiguous pieces evaluated side by side (each carrying its own state); with
``streams=1`` it is exactly one sequence.

Bits per byte: the mean next-token loss in bits times tokens per byte of the split,
``bpb = mean_nll / ln 2 * n_tokens / n_bytes``. For byte-level data ``n_tokens = n_bytes``, so a
model with uniform logits over 256 bytes scores exactly 8 bits per byte. For tokenized text
(PG-19) ``n_bytes`` is the UTF-8 byte count of the original text (``corpus.split_bytes``), so the
number is comparable across tokenizers.

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

from transformer_vq.config import EvalConfig
from transformer_vq.config.jobs import job_config
from transformer_vq.data.batches import check_vocab


@dataclass
class EvalResult:
    """What :func:`evaluate_tokens` measured."""

    split: str
    loss: float
    """Mean next-token cross-entropy in nats."""
    bits_per_byte: float
    tokens: int
    """Number of predicted tokens."""
    seconds: float
    tokens_per_s: float
    word_perplexity: float | None = None
    """Word-level perplexity, for corpora that count the words of their original text (PG-19); else None."""

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_tokens(model: torch.nn.Module, tokens: np.ndarray, *, window_len: int, tokens_per_byte: float = 1.0,
                    streams: int = 1, max_tokens: int = 0, precision: str = "float32", split: str = "validation",
                    progress: bool | None = None, tokens_per_word: float | None = None) -> EvalResult:
    """Evaluate ``model`` on a flat token array.

    Args:
        model: a model called as ``model(input_ids, state=state)`` returning ``.logits`` and ``.state``.
        tokens: 1-D token ids of the split.
        window_len: tokens per forward call (memory bound only; the state makes the result independent
            of it up to float rounding).
        tokens_per_byte: tokens of the whole split divided by its bytes (1 for byte-level data).
        streams: contiguous pieces evaluated as one batch.
        max_tokens: evaluate only the first this many tokens (0 = all).
        precision: 'float32' or 'bfloat16' autocast.
        progress: show a progress bar (default: when stderr is a terminal).
        tokens_per_word: tokens of the whole split divided by the whitespace-separated words of its
            original text; given, the result has a word-level perplexity.
    """
    if max_tokens:
        tokens = tokens[:max_tokens]
    n_pred = len(tokens) - 1
    if n_pred < 1:
        raise ValueError(f"the {split} split has {len(tokens)} tokens; evaluation needs at least 2")
    streams = max(1, min(streams, n_pred))
    device = next(model.parameters()).device
    piece = math.ceil(n_pred / streams)
    # (streams, piece + 1): stream s predicts tokens[s*piece + 1 : (s+1)*piece + 1]; the last stream is
    # padded, and its padded positions are masked out of the loss
    rows = np.zeros((streams, piece + 1), dtype=np.int64)
    mask = np.zeros((streams, piece), dtype=bool)
    for s in range(streams):
        chunk = np.asarray(tokens[s * piece: min((s + 1) * piece, n_pred) + 1], dtype=np.int64)
        rows[s, :len(chunk)] = chunk
        mask[s, :len(chunk) - 1] = True
    rows_t = torch.from_numpy(rows).to(device)
    mask_t = torch.from_numpy(mask).to(device)

    was_training = model.training
    model.eval()
    total_nll = torch.zeros((), dtype=torch.float64, device=device)
    state = None
    starts = range(0, piece, window_len)
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"eval {split}", unit="window", leave=False)
    begin = time.perf_counter()
    try:
        for start in starts:
            end = min(start + window_len, piece)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                out = model(rows_t[:, start:end], state=state)
            state = out.state
            # (streams, w): per-token NLL in float32 whatever the autocast dtype
            nll = F.cross_entropy(out.logits.float().transpose(1, 2), rows_t[:, start + 1:end + 1], reduction="none")
            total_nll += nll[mask_t[:, start:end]].sum(dtype=torch.float64)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - begin
    loss = total_nll.item() / n_pred
    word_perplexity = None
    if tokens_per_word is not None:
        # an untrained model over a large vocabulary can overflow a float: report inf
        exponent = loss * tokens_per_word
        word_perplexity = math.exp(exponent) if exponent < 709 else math.inf
    return EvalResult(split=split, loss=loss, bits_per_byte=loss / math.log(2) * tokens_per_byte, tokens=n_pred,
                      seconds=seconds, tokens_per_s=n_pred / max(seconds, 1e-9), word_perplexity=word_perplexity)


def corpus_tokens_per_byte(corpus, split: str) -> float:
    """Tokens per byte of ``split`` of a :class:`~transformer_vq.data.corpus.Corpus`."""
    n_bytes = corpus.split_bytes.get(split) or len(corpus.split(split))
    return len(corpus.split(split)) / n_bytes


def corpus_tokens_per_word(corpus, split: str) -> float | None:
    """Tokens per whitespace-separated word of the original text of ``split``, for corpora that count
    words (``metadata["split_words"]``, e.g. PG-19); None otherwise."""
    words = (corpus.metadata.get("split_words") or {}).get(split)
    return len(corpus.split(split)) / words if words else None


def evaluate(ckpt: str | EvalConfig, **options) -> EvalResult:
    """Evaluate a checkpoint (a run directory or a checkpoint directory) on a split of its corpus.

    ``ckpt`` is an :class:`~transformer_vq.config.EvalConfig`, or a checkpoint path with the other
    EvalConfig fields as keywords (``evaluate("runs/default", split="test", max_tokens=10_000)``).
    The corpus (with its saved loader options, and the run's copy of its tokenizer), model and
    precision come from the checkpoint's saved config; ``data_path`` replaces the saved data path
    (for data that moved) and ``data_options`` override saved loader options.
    """
    from transformer_vq.train.build import load_corpus_for, model_from_checkpoint, run_dir_of

    cfg = job_config(EvalConfig, ckpt, **options)
    split = cfg.split
    model, run_cfg, checkpoint = model_from_checkpoint(cfg.ckpt, device=cfg.device)
    corpus = load_corpus_for(run_cfg.train, data_path=cfg.data_path, run_dir=run_dir_of(checkpoint),
                             data_options=cfg.data_options)
    tokens = corpus.split(split)
    check_vocab(tokens, run_cfg.model.vocab_size, split)
    return evaluate_tokens(
        model, tokens, window_len=cfg.window_len or run_cfg.train.update_len,
        tokens_per_byte=corpus_tokens_per_byte(corpus, split),
        tokens_per_word=corpus_tokens_per_word(corpus, split),
        streams=cfg.streams or run_cfg.train.eval_streams, max_tokens=cfg.max_tokens,
        precision=run_cfg.train.precision, split=split,
    )
