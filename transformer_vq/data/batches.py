"""Batches of training windows over one split, sharded over data-parallel ranks, resumable.

A split is a flat array of token ids. It is cut into ``n_windows = (len(tokens) - 1) // seq_len``
non-overlapping sequences; sequence ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len + 1]`` (one
extra token so inputs and next-token targets come from the same row). Each epoch visits the
sequences in a fresh random order drawn from ``(seed, epoch)`` alone, and groups consecutive ones
into global batches of ``batch_size`` rows, dropping the remainder. A data-parallel rank reads only
its own contiguous slice of rows of every global batch, so ``world_size`` ranks together see exactly
the batch one process would see, which is what makes 1-process and N-process training agree.

The position is two integers (epoch, batch index within the epoch): saving and restoring them
resumes the exact same sequence of batches, on any number of restarts.

Packed documents: given the split's document starts, :meth:`TokenBatches.next_batch` also returns each token's
position in its document (0 where one begins), the ``position_ids`` the model separates documents by.
"""

from __future__ import annotations

import numpy as np
import torch

from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError


class TokenBatches:
    """An endless, deterministic, resumable iterator of ``[batch_size // world_size, seq_len + 1]``
    token windows (``torch.long``) from one split.

    Args:
        tokens: the split, a 1-D integer array.
        batch_size: global batch size (rows summed over all ranks); a multiple of ``world_size``.
        seq_len: tokens per sequence (targets are the inputs shifted by one).
        seed: fixes the order of sequences in every epoch.
        rank, world_size: which slice of every global batch this process reads.
        vocab_size: when given, every token must be in ``[0, vocab_size)`` (checked once, up front).
        split: the split's name, only for error messages.
        documents: the sorted offsets where the split's documents begin (``Corpus.documents``); when given,
            :meth:`next_batch` returns the positions of the tokens in their documents too.
    """

    def __init__(self, tokens: np.ndarray, *, batch_size: int, seq_len: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, vocab_size: int | None = None, split: str = "train",
                 documents: np.ndarray | None = None):
        check_workers(batch_size, world_size)
        n_tokens = len(tokens)
        n_windows = max(n_tokens - 1, 0) // seq_len
        if n_windows < batch_size:
            needed = batch_size * seq_len + 1
            raise ValueError(
                f"the {split} split has {n_tokens} tokens, too short for one batch of {batch_size} sequences of "
                f"{seq_len} tokens (needs at least {needed}); use more data or lower batch_size / seq_len"
            )
        if vocab_size is not None:
            check_vocab(tokens, vocab_size, split)
        self.tokens = tokens
        # a split cut out of a longer stream may begin mid-document: its first token starts one here
        self.documents = None if documents is None else np.union1d([0], np.asarray(documents, dtype=np.int64))
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.n_windows = n_windows
        self.batches_per_epoch = n_windows // batch_size
        self.epoch = 0
        self.index = 0
        self._order_epoch = -1
        self._order = None

    def _epoch_order(self) -> np.ndarray:
        """The permutation of sequence indices for the current epoch (cached)."""
        if self._order_epoch != self.epoch:
            self._order = epoch_order(self.n_windows, self.seed, self.epoch)
            self._order_epoch = self.epoch
        return self._order

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        return self.next_batch()[0]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next ``[B_local, seq_len + 1]`` tokens and, with ``documents``, each token's position in its document
        (same shape, int64; ``None`` without)."""
        order = self._epoch_order()
        rows_per_rank = self.batch_size // self.world_size
        first = self.index * self.batch_size + self.rank * rows_per_rank
        starts = order[first:first + rows_per_rank] * self.seq_len
        # (B_local, seq_len + 1): gather each window; int64 because embedding lookups need it
        batch = np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64) for s in starts])
        self.index += 1
        if self.index == self.batches_per_epoch:
            self.epoch += 1
            self.index = 0
        if self.documents is None:
            return torch.from_numpy(batch), None
        offsets = starts[:, None] + np.arange(self.seq_len + 1)  # (B_local, seq_len + 1) offsets in the split
        first = self.documents[np.searchsorted(self.documents, offsets, side="right") - 1]
        return torch.from_numpy(batch), torch.from_numpy(offsets - first)

    def state_dict(self) -> dict:
        """The position in the stream of batches (plus the settings it is only valid for)."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "n_windows": self.n_windows}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a position saved by :meth:`state_dict` with the same settings and data."""
        check_resume(state, self, ("seed", "batch_size", "seq_len", "n_windows"))
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])


def check_workers(batch_size: int, workers: int, *, kept: bool = False, context_parallel: int = 1) -> None:
    """Refuse (``ValueError``) a global batch of ``batch_size`` rows that ``workers`` data-parallel workers cannot
    share out evenly. ``kept``: the batch size is a resumed run's, which the resume keeps (another is refused), so
    the way out is another number of workers, the nearest that divide it (torchrun's ``--nproc_per_node``: each
    times ``context_parallel``), or one process."""
    if batch_size % workers == 0:
        return
    if not kept:
        raise ValueError(f"batch_size={batch_size} must be a multiple of the number of data-parallel workers "
                         f"({workers}); set batch_size to a multiple of {workers}")
    fits = [n for n in range(2, batch_size + 1) if batch_size % n == 0]
    near = [n for n in fits if n < workers][-1:] + [n for n in fits if n > workers][:1]
    how = "in one process (without torchrun" + (", with --context-parallel 1)" if context_parallel > 1 else ")")
    if near:
        cp = f", with --context-parallel {context_parallel}" if context_parallel > 1 else ""
        counts = " or ".join(str(n * context_parallel) for n in near)
        how = f"with a number of workers that divides {batch_size} (torchrun --nproc_per_node {counts}{cp}) or {how}"
    raise ValueError(f"batch_size={batch_size}, which the resumed run keeps, must be a multiple of the number of "
                     f"data-parallel workers ({workers}): resume it {how}")


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``n`` items visited in ``epoch``: a function of ``(seed, epoch)`` alone."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator).numpy()


def check_resume(state: dict, batches, keys: tuple[str, ...]) -> None:
    """Raise a clear error when a saved data position's settings ``keys`` differ from ``batches``'s."""
    for key in keys:
        if int(state[key]) != getattr(batches, key):
            raise ValueError(
                f"cannot resume the data position: it was saved with {key}={int(state[key])} but this run has "
                f"{key}={getattr(batches, key)}; resume with the same data and batch settings or start a new run"
            )


def check_vocab(tokens: np.ndarray, vocab_size: int, split: str) -> None:
    """Raise a clear error when a token id falls outside ``[0, vocab_size)``."""
    if len(tokens) == 0:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"the {split} split contains token id {bad}, outside the model's vocabulary [0, {vocab_size}); "
            f"set model vocab_size to at least {high + 1} (--set model.vocab_size={high + 1}) or fix the data"
        )


def check_decodable(corpus: Corpus, vocab_size: int) -> None:
    """Raise a clear error when a model of ``vocab_size`` token ids could emit ids ``corpus`` cannot decode: a larger
    vocabulary trains (the data never holds those ids), then fails at the end-of-run sample and in ``tvq sample``."""
    if vocab_size > corpus.vocab_size:
        raise ValueError(f"--vocab-size: the model has {vocab_size} token ids and the {corpus.name} corpus "
                         f"{corpus.vocab_size}: the ids above {corpus.vocab_size - 1} could be sampled and never "
                         f"decoded; set --vocab-size {corpus.vocab_size}")


def packed_documents(corpus: Corpus, split: str) -> np.ndarray:
    """The document starts of ``split`` for packing, or a ``DataError`` when the corpus records none, or one only (a
    single text file: packing one document would change nothing, and silently)."""
    documents = corpus.documents.get(split)
    if documents is None or len(documents) < 2:
        held = "none" if documents is None or len(documents) == 0 else "one document only"
        # a split's own start is recorded at 0; a start past it in another split is a document the cut put there
        if any(name != split and (np.asarray(starts) > 0).any() for name, starts in corpus.documents.items()):
            raise DataError(f"--pack needs two documents or more in the {split} split, and {corpus.name!r} begins "
                            f"{held} there: the corpus is cut into splits by position, in order (the first tokens "
                            f"train), and its other documents begin in other splits; use more or smaller files, "
                            f"--data-option lines=true for a file of records, or leave --pack off")
        raise DataError(f"--pack needs a corpus whose documents are known, and {corpus.name!r} records {held} for "
                        f"its {split} split; use --data shakespeare or pg19, --data text with a directory of several "
                        "files (one document each) or a file read with --data-option lines=true (one per line), or "
                        "leave --pack off")
    return documents


def corpus_batches(corpus: Corpus, split: str, **kwargs) -> TokenBatches:
    """:class:`TokenBatches` over ``corpus.split(split)``, naming the split in its errors."""
    return TokenBatches(corpus.split(split), split=split, **kwargs)
