"""A synthetic long-range memory probe: associative recall across a controlled distance.

Every episode is one training sequence of ``seq_len`` bytes, read by the model from its first byte with a fresh
state (the training loop resets the state at every batch of sequences and carries it across the backprop windows
of one sequence). An episode holds, in order::

    #A=3;F=0;K=7;...;          n_pairs key=value pairs (distinct keys, sorted; random values)
    filler ... ?K=7; filler ... ?A=3; filler ...      n_queries queries, each key asked once

The scored tokens are the answers: the value bytes of each query, which are the value of its key in the pairs
region. The distance of a query is the number of positions from the pair's first value byte to the query's first
answer byte; query positions are drawn so that the offset after the pairs is log-uniform, which gives every
distance bucket of :func:`transformer_vq.train.lm.recall.accuracy_by_distance` (1-2, 2-4, 4-8, ... blocks) a similar
share of queries. Each key is asked once, so the pairs region is the only earlier place the answer appears and the
recorded distance is the distance that must be bridged.

Alphabets are disjoint: keys are upper-case letters, values digits (chance is ``10 ** -value_len`` per answer),
filler lower-case letters and space. The filler is ``"pattern"`` (a random phrase of ``phrase_len`` bytes repeated
at fixed phase, so a model learns to predict it and the gradient is left to the pairs and answers),
``"random"`` (independent bytes: a harder, noisier variant) or ``"text"`` (a contiguous run of real text: the recall
task mixed into language-model data, so that a model must both model text and recall across it). Text filler is
Shakespeare (:mod:`transformer_vq.data.shakespeare`), each split of episodes from the same split of the text
(training episodes from its training split, validation from validation, test from test: no text is shared), lower-
cased and with the probe's own bytes (digits, ``#=;?``) replaced (:func:`clean_text`), so the alphabets stay
disjoint and a query's pair is still the only earlier place its answer appears.

Episode ``i`` of a split is a function of ``(seed, split, i)`` alone (and, for text filler, of the text), so any
episode can be regenerated without the others (the evaluation regenerates the answers it scores); nothing is
stored on disk. The start of a text filler is drawn by a generator of its own (:func:`text_filler`), so an episode's
layout (pairs, values, where the queries are) does not depend on the text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated

import numpy as np

from transformer_vq.data.codec import BYTE_VOCAB
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import NonNegative, Positive, Rules

HEADER, ASSIGN, END, QUERY = (ord(c) for c in "#=;?")
KEYS = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
VALUES = np.frombuffer(b"0123456789", dtype=np.uint8)
FILLER = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
FILLERS = ("pattern", "random", "text")
SPLIT_CODES = {"train": 0, "validation": 1, "test": 2}


@dataclass(frozen=True)
class RecallSpec:
    """The shape of every episode (see the module docstring)."""

    seq_len: int = 2048
    n_pairs: int = 8
    n_queries: int = 8
    key_len: int = 1
    value_len: int = 1
    filler: str = "pattern"
    phrase_len: int = 16

    def __post_init__(self):
        for name in ("seq_len", "n_pairs", "n_queries", "key_len", "value_len", "phrase_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise DataError(f"recall probe: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.filler not in FILLERS:
            raise DataError(f"recall probe: filler must be one of {', '.join(FILLERS)}, got {self.filler!r}")
        if self.n_queries > self.n_pairs:
            raise DataError(f"recall probe: n_queries={self.n_queries} exceeds n_pairs={self.n_pairs}; every key is "
                            f"asked at most once")
        if self.n_pairs > len(KEYS) ** self.key_len:
            raise DataError(f"recall probe: n_pairs={self.n_pairs} needs more distinct keys than "
                            f"{len(KEYS)}**key_len={len(KEYS) ** self.key_len}; raise key_len")
        if self.free_room < 1:
            raise DataError(f"recall probe: seq_len={self.seq_len} is too short for {self.n_pairs} pairs and "
                            f"{self.n_queries} queries (needs at least {self.seq_len - self.free_room + 1})")

    @property
    def pair_len(self) -> int:
        """Bytes of one pair: key, '=', value, ';'."""
        return self.key_len + self.value_len + 2

    @property
    def query_len(self) -> int:
        """Bytes of one query: '?', key, '=', value, ';'."""
        return self.key_len + self.value_len + 3

    @property
    def pairs_end(self) -> int:
        """Position just after the pairs region (the header byte, then the pairs)."""
        return 1 + self.n_pairs * self.pair_len

    @property
    def free_room(self) -> int:
        """Filler positions after the pairs region: the range of the queries' offsets."""
        return self.seq_len - self.pairs_end - self.n_queries * self.query_len

    @property
    def chance(self) -> float:
        """Probability of answering a query right by guessing values uniformly."""
        return float(len(VALUES)) ** -self.value_len


@dataclass
class Episode:
    """One generated sequence and where its answers are."""

    tokens: np.ndarray
    """``[seq_len]`` uint8 bytes."""
    answer_pos: np.ndarray
    """``[n_queries, value_len]`` positions of the answer bytes (the scored targets)."""
    value_pos: np.ndarray
    """``[n_queries, value_len]`` positions of the same bytes in the pairs region."""

    @property
    def distances(self) -> np.ndarray:
        """``[n_queries]`` positions from the pair's first value byte to the query's first answer byte."""
        return self.answer_pos[:, 0] - self.value_pos[:, 0]


def episode_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of episode ``index`` of ``split``: a function of these three alone."""
    return np.random.default_rng([seed, SPLIT_CODES[split], index])


# Text bytes the probe uses for itself, and what a text filler holds in their place (punctuation kept as punctuation).
RESERVED = {**{ord(d): ord(" ") for d in "0123456789"}, QUERY: ord("."), END: ord(","), ASSIGN: ord(" "),
            HEADER: ord(" ")}


def clean_text(text: np.ndarray) -> np.ndarray:
    """``text`` (uint8 bytes) lower-cased, with digits and ``#=;?`` replaced (``?`` by ``.``, ``;`` by ``,``, the
    others by a space), so that it shares no byte with the keys, values and markers of the probe."""
    table = np.arange(256, dtype=np.uint8)
    table[KEYS] = KEYS + (ord("a") - ord("A"))
    for byte, replacement in RESERVED.items():
        table[byte] = replacement
    return table[np.asarray(text, dtype=np.uint8)]


def text_filler(source: np.ndarray, seq_len: int, seed: int, split: str, index: int) -> np.ndarray:
    """The filler of text episode ``index``: ``seq_len`` bytes of ``source`` (the cleaned text of the episode's
    split) from a start drawn by a generator of ``(seed, split, index)`` kept apart from the episode's layout."""
    if len(source) < seq_len:
        raise DataError(f"recall probe: the {split} text ({len(source)} bytes) is shorter than one episode "
                        f"({seq_len}); lower seq_len")
    start = int(np.random.default_rng([seed, SPLIT_CODES[split], index, 1]).integers(0, len(source) - seq_len + 1))
    return source[start:start + seq_len].copy()


def recall_episode(spec: RecallSpec, seed: int, split: str, index: int, filler: np.ndarray | None = None) -> Episode:
    """Episode ``index`` of ``split`` (deterministic in ``(spec, seed, split, index)``).

    ``filler``: for ``spec.filler == "text"`` only, and needed there: the ``seq_len`` bytes the pairs and queries are
    written over (:func:`text_filler`; an episode's own tokens give the same episode back, see :func:`stored_episode`).
    """
    if (filler is not None) != (spec.filler == "text"):
        raise DataError(f"recall probe: filler bytes are given for (and only for) the text filler; filler is "
                        f"{spec.filler!r} and filler bytes were {'given' if filler is not None else 'not given'}")
    rng = episode_rng(seed, split, index)
    n, kl, vl = spec.n_pairs, spec.key_len, spec.value_len
    key_ids = np.sort(rng.choice(len(KEYS) ** kl, size=n, replace=False))
    # key id -> key_len letters, most significant first
    keys = KEYS[(key_ids[:, None] // len(KEYS) ** np.arange(kl - 1, -1, -1)) % len(KEYS)]
    values = VALUES[rng.integers(0, len(VALUES), size=(n, vl))]
    if spec.filler == "pattern":
        phrase = FILLER[rng.integers(0, len(FILLER), size=spec.phrase_len)]
        tokens = phrase[np.arange(spec.seq_len) % spec.phrase_len]
    elif spec.filler == "random":
        tokens = FILLER[rng.integers(0, len(FILLER), size=spec.seq_len)]
    else:
        if filler.shape != (spec.seq_len,):
            raise DataError(f"recall probe: text filler must be {spec.seq_len} bytes, got shape {filler.shape}")
        tokens = np.array(filler, dtype=np.uint8)
    tokens[0] = HEADER
    pairs = np.concatenate([keys, np.full((n, 1), ASSIGN, np.uint8), values, np.full((n, 1), END, np.uint8)], axis=1)
    tokens[1:spec.pairs_end] = pairs.reshape(-1)
    # log-uniform offsets in [0, free_room), sorted; each query shifted past the ones before it
    offsets = np.sort(np.floor(np.exp(rng.random(spec.n_queries) * np.log(spec.free_room + 1))).astype(np.int64) - 1)
    starts = spec.pairs_end + offsets + np.arange(spec.n_queries) * spec.query_len
    asked = rng.permutation(n)[:spec.n_queries]
    for start, pair in zip(starts, asked):
        tokens[start:start + spec.query_len] = np.concatenate([[QUERY], pairs[pair]])
    answer_pos = starts[:, None] + 2 + kl + np.arange(vl)
    value_pos = 1 + asked[:, None] * spec.pair_len + kl + 1 + np.arange(vl)
    return Episode(tokens=tokens, answer_pos=answer_pos, value_pos=value_pos)


PARTS = ("pairs", "filler", "queries", "answers")
"""The kinds of byte of an episode (:func:`episode_parts`): the header and the key=value pairs; the filler (with the
``;`` that closes each query); each query's ``?``, key and ``=`` (where a query comes and which key it asks: knowing
which keys were defined and not yet asked is itself a memory of the pairs); the answers."""


def episode_parts(spec: RecallSpec, episode: Episode) -> np.ndarray:
    """``[seq_len]`` index into :data:`PARTS` of every byte of ``episode`` (an episode of ``spec``)."""
    parts = np.full(spec.seq_len, PARTS.index("filler"), dtype=np.int64)
    parts[:spec.pairs_end] = PARTS.index("pairs")
    # a query is '?', key, '=', value, ';' and its first answer byte comes key_len + 2 bytes after the '?'
    query_bytes = episode.answer_pos[:, :1] - spec.key_len - 2 + np.arange(spec.key_len + 2)
    parts[query_bytes] = PARTS.index("queries")
    parts[episode.answer_pos] = PARTS.index("answers")
    return parts


def recall_split(spec: RecallSpec, seed: int, split: str, n_episodes: int,
                 text: np.ndarray | None = None) -> np.ndarray:
    """Episodes ``0 .. n_episodes - 1`` of ``split`` back to back: ``[n_episodes * seq_len]`` uint8. ``text``: the
    cleaned text of ``split`` (:func:`clean_text`), for the text filler only."""
    def filler(index):
        return None if spec.filler != "text" else text_filler(text, spec.seq_len, seed, split, index)
    return np.concatenate([recall_episode(spec, seed, split, i, filler(i)).tokens for i in range(n_episodes)])


def stored_episode(corpus: Corpus, split: str, index: int) -> Episode:
    """Episode ``index`` of ``split`` of a recall-probe corpus, its tokens read from the corpus (so a text filler
    needs no text) and its layout regenerated."""
    spec = spec_of(corpus)
    tokens = corpus.splits[split][index * spec.seq_len:(index + 1) * spec.seq_len]
    episode = recall_episode(spec, corpus.metadata["seed"], split, index, tokens if spec.filler == "text" else None)
    if not np.array_equal(episode.tokens, tokens):
        raise DataError(f"recall probe: episode {index} of {split} does not match its regeneration; the corpus was "
                        f"not made by this version of the generator")
    return episode


def filler_text(cache_dir=None) -> dict[str, np.ndarray]:
    """The text of the text filler, cleaned (:func:`clean_text`), by split: Shakespeare's training, validation and
    test splits."""
    from transformer_vq.data.shakespeare import load_shakespeare
    corpus = load_shakespeare(cache_dir=cache_dir)
    return {split: clean_text(corpus.splits[split]) for split in SPLIT_CODES}


def load_recall(data_path=None, *, cache_dir=None, seq_len: Positive = 2048, n_pairs: Positive = 8,
                n_queries: Positive | None = None, key_len: Positive = 1, value_len: Positive = 1,
                filler: Annotated[str, Rules(choices=FILLERS)] = "pattern", phrase_len: Positive | None = None,
                seed: NonNegative = 0, train_episodes: Positive = 2048, eval_episodes: Positive = 64) -> Corpus:
    """The recall probe as a byte-level corpus: ``train_episodes`` training episodes and ``eval_episodes`` each for
    validation and test, generated from ``seed`` (see the module docstring).

    ``seq_len`` is the training sequence length: ``tvq train`` passes its own ``--seq-len``, so every training
    sequence is exactly one episode. ``n_queries`` defaults to ``n_pairs``. ``phrase_len`` (default 16) is the
    pattern filler's and refused with another filler. ``data_path`` must be left out (the data is generated; the
    text filler reads Shakespeare, fetched into ``cache_dir`` as ``--data shakespeare`` does).
    """
    if data_path is not None:
        raise DataError("the recall probe is generated from its seed and reads no files; leave --data-path out")
    if phrase_len is not None and filler != "pattern":
        raise DataError(f"recall probe: phrase_len is the pattern filler's; filler {filler!r} has no phrase, leave "
                        f"phrase_len out")
    spec = RecallSpec(seq_len=seq_len, n_pairs=n_pairs, n_queries=n_pairs if n_queries is None else n_queries,
                      key_len=key_len, value_len=value_len, filler=filler,
                      phrase_len=16 if phrase_len is None else phrase_len)
    counts = {"train": train_episodes, "validation": eval_episodes, "test": eval_episodes}
    for split, count in counts.items():
        if not isinstance(count, int) or count < 1:
            raise DataError(f"recall probe: {split} needs at least one episode, got {count!r}")
    text = filler_text(cache_dir) if filler == "text" else {}
    splits = {split: recall_split(spec, seed, split, count, text.get(split)) for split, count in counts.items()}
    documents = {split: np.arange(count, dtype=np.int64) * seq_len for split, count in counts.items()}
    metadata = {"probe": "recall", "spec": asdict(spec), "seed": seed, "episodes": counts}
    if filler == "text":
        metadata["filler_text"] = {"corpus": "shakespeare", "bytes": {split: len(t) for split, t in text.items()}}
    return Corpus(name="recall", splits=splits, vocab_size=BYTE_VOCAB, documents=documents, metadata=metadata)


def spec_of(corpus: Corpus) -> RecallSpec | None:
    """The :class:`RecallSpec` of a recall-probe corpus, or None for any other corpus."""
    if corpus.metadata.get("probe") != "recall":
        return None
    return RecallSpec(**corpus.metadata["spec"])
