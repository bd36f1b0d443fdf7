"""Scoring the recall probe (:mod:`transformer_vq.data.recall`): accuracy of the answers by distance in blocks.

Each episode is read as the training loop reads it: from its first byte with a fresh state, in windows whose
state is carried to the next, so a query's pair is reachable only through what the state keeps (the two-block
window; the compressive cache of Transformer-VQ; every key and value for full attention). A query counts as
answered when the model's most likely next byte is right at every answer position (teacher forcing: the first
answer byte is in the input when the second is predicted). The same reading gives the bits the model spends on each
answer byte (``-log2`` of its probability): their mean per bucket is the answer bits per byte, a measure that moves
before the argmax does, and the one that adds up to the split's bits per byte.

Distances are measured in blocks of the model's ``block_len`` L and bucketed by powers of two: ``0-2`` (the pair
is at most two blocks back: the window can see it), ``2-4``, ``4-8``, ``8-16``, ... Chance is the probability of
guessing a value, ``10 ** -value_len``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.recall import PARTS, episode_parts, spec_of, stored_episode
from transformer_vq.nn.inference import evaluating


def distance_bucket(distance: int, block_len: int) -> int:
    """Bucket index of a distance in tokens: 0 for under 2 blocks, k for ``[2**k, 2**(k+1))`` blocks."""
    blocks = distance // block_len
    return 0 if blocks < 2 else blocks.bit_length() - 1


def bucket_label(index: int) -> str:
    """``"0-2"``, ``"2-4"``, ``"4-8"``, ...: the bucket's range in blocks."""
    return "0-2" if index == 0 else f"{2 ** index}-{2 ** (index + 1)}"


def accuracy_by_distance(correct, distances, block_len: int, bits=None) -> list[dict]:
    """Per distance bucket (in blocks of ``block_len``): queries, correct answers and accuracy, from the first
    bucket to the farthest bucket that holds a query (empty buckets between have accuracy None).

    ``bits``: ``[queries, value_len]`` bits spent on each answer byte; given, every row also has ``answer_bpb``, their
    mean over the bucket's answer bytes (None when empty)."""
    correct, distances = np.asarray(correct, dtype=bool), np.asarray(distances, dtype=np.int64)
    if correct.shape != distances.shape:
        raise ValueError(f"correct {correct.shape} and distances {distances.shape} must have the same shape")
    if bits is not None:
        bits = np.asarray(bits, dtype=np.float64)
        if bits.ndim != 2 or bits.shape[0] != len(distances):
            raise ValueError(f"bits {bits.shape} must be [queries, value_len] with {len(distances)} queries")
    if block_len < 1:
        raise ValueError(f"block_len must be positive, got {block_len}")
    buckets = np.array([distance_bucket(int(d), block_len) for d in distances], dtype=np.int64)
    rows = []
    for index in range(int(buckets.max()) + 1 if len(buckets) else 0):
        chosen = buckets == index
        n, right = int(chosen.sum()), int(correct[chosen].sum())
        rows.append({"bucket": bucket_label(index), "lo_blocks": 0 if index == 0 else 2 ** index,
                     "hi_blocks": 2 ** (index + 1), "queries": n, "correct": right,
                     "accuracy": right / n if n else None})
        if bits is not None:
            rows[-1]["answer_bpb"] = float(bits[chosen].mean()) if n else None
    return rows


@dataclass
class RecallResult:
    """What :func:`recall_accuracy` measured."""

    split: str
    episodes: int
    block_len: int
    chance: float
    accuracy: float
    """Over every query of the episodes."""
    answer_bpb: float | None = None
    """Mean bits per answer byte over every query of the episodes."""
    buckets: list[dict] = field(default_factory=list)
    """:func:`accuracy_by_distance` rows."""
    bpb: float | None = None
    """Bits per byte over every scored byte of the episodes (each episode's first byte is not predicted)."""
    parts: dict = field(default_factory=dict)
    """:func:`bits_by_part`: where those bits go."""

    def to_dict(self) -> dict:
        return asdict(self)


def bits_by_part(parts, bits) -> dict:
    """Per kind of byte (:data:`~transformer_vq.data.recall.PARTS`), from ``parts`` (its index per byte) and
    ``bits`` (spent per byte; NaN where nothing was predicted, which is left out): the bytes scored, their mean bits
    and ``bpb_share``, their bits over every scored byte; the shares add up to the episodes' bits per byte, so two
    models' difference in bits per byte splits into the parts' differences."""
    parts, bits = np.asarray(parts).reshape(-1), np.asarray(bits, dtype=np.float64).reshape(-1)
    if parts.shape != bits.shape:
        raise ValueError(f"parts {parts.shape} and bits {bits.shape} must have the same shape")
    scored = ~np.isnan(bits)
    total = int(scored.sum())
    result = {}
    for index, name in enumerate(PARTS):
        chosen = scored & (parts == index)
        n = int(chosen.sum())
        result[name] = {"bytes": n, "bits_per_byte": float(bits[chosen].mean()) if n else None,
                        "bpb_share": float(bits[chosen].sum()) / total if total else None}
    return result


def answer_predictions(model: torch.nn.Module, rows: torch.Tensor,
                       window_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` most likely byte at every position of ``rows`` ``[B, T]`` (position 0 gets -1), and ``[B, T]`` bits
    spent on the byte actually there (``-log2 p``; position 0 gets NaN), predicted from the bytes before it with the
    state carried from window to window, starting fresh."""
    predicted = torch.full_like(rows, -1)
    bits = torch.full(rows.shape, float("nan"), dtype=torch.float64, device=rows.device)
    state = None
    length = rows.shape[1]
    for start in range(0, length, window_len):  # whole windows, as in training (the last logit predicts nothing)
        end = min(start + window_len, length)
        out = model(rows[:, start:end], state=state)
        state = out.state
        n = min(end + 1, length) - start - 1
        logits = out.logits[:, :n].double()
        predicted[:, start + 1:start + 1 + n] = logits.argmax(dim=-1)
        log_p = torch.log_softmax(logits, dim=-1).gather(-1, rows[:, start + 1:start + 1 + n, None])[..., 0]
        bits[:, start + 1:start + 1 + n] = -log_p / np.log(2.0)
    return predicted, bits


def recall_accuracy(model: torch.nn.Module, corpus: Corpus, split: str = "validation", *, block_len: int,
                    window_len: int, batch_size: int = 16, max_episodes: int = 0) -> RecallResult:
    """Answer accuracy and bits per answer byte of ``model`` on the episodes of ``split`` of a recall-probe corpus,
    by distance in blocks of ``block_len`` (``max_episodes``: only the first this many; 0 = all)."""
    spec = spec_of(corpus)
    if spec is None:
        raise DataError(f"corpus {corpus.name!r} is not the recall probe; train with --data recall")
    n_episodes = corpus.metadata["episodes"][split] if not max_episodes else \
        min(max_episodes, corpus.metadata["episodes"][split])
    device = next(model.parameters()).device
    correct, distances, parts, spent = [], [], [], []
    with evaluating(model):
        for first in range(0, n_episodes, batch_size):
            episodes = [stored_episode(corpus, split, i) for i in range(first, min(first + batch_size, n_episodes))]
            rows = torch.from_numpy(np.stack([e.tokens for e in episodes]).astype(np.int64)).to(device)
            predicted, batch_bits = (t.cpu().numpy() for t in answer_predictions(model, rows, window_len))
            for b, episode in enumerate(episodes):
                # a query is right when every answer byte is: [n_queries, value_len] -> [n_queries]
                correct.append((predicted[b][episode.answer_pos] == episode.tokens[episode.answer_pos]).all(axis=1))
                distances.append(episode.distances)
                parts.append(episode_parts(spec, episode))
                spent.append(batch_bits[b])
    correct, distances = np.concatenate(correct), np.concatenate(distances)
    parts, spent = np.concatenate(parts), np.concatenate(spent)
    # answers come query after query, their bytes in order: the answer bytes' bits in reading order are [query, byte]
    bits = spent[parts == PARTS.index("answers")].reshape(-1, spec.value_len)
    return RecallResult(split=split, episodes=n_episodes, block_len=block_len, chance=spec.chance,
                        accuracy=float(correct.mean()), answer_bpb=float(bits.mean()),
                        buckets=accuracy_by_distance(correct, distances, block_len, bits),
                        bpb=float(np.nanmean(spent)), parts=bits_by_part(parts, spent))


def recall_table(result: dict) -> str:
    """A markdown table of one :meth:`RecallResult.to_dict`: accuracy (and, when measured, bits per answer byte) by
    distance bucket, then overall and chance."""
    with_bits = result.get("answer_bpb") is not None
    lines = [f"recall accuracy by distance (blocks of L = {result['block_len']}; {result['episodes']} episodes of "
             f"{result['split']}; chance {result['chance']:.1%})", "",
             "| distance (blocks) | queries | accuracy |" + (" answer bits/byte |" if with_bits else ""),
             "|---|---:|---:|" + ("---:|" if with_bits else "")]

    def bits(value):
        return (" - |" if value is None else f" {value:.3f} |") if with_bits else ""
    for row in result["buckets"]:
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.1%}"
        lines.append(f"| {row['bucket']} | {row['queries']} | {accuracy} |" + bits(row.get("answer_bpb")))
    lines.append(f"| all | {sum(r['queries'] for r in result['buckets'])} | {result['accuracy']:.1%} |"
                 + bits(result.get("answer_bpb")))
    return "\n".join(lines + _parts_table(result))


def _parts_table(result: dict) -> list[str]:
    """Where the episodes' bits per byte go, by kind of byte (when measured)."""
    if not result.get("parts"):
        return []
    lines = ["", f"bits by kind of byte (the shares add up to {result['bpb']:.4f} bits per byte over every byte but "
             "each episode's first)", "",
             "| part | bytes | bits/byte | share of bits per byte |", "|---|---:|---:|---:|"]
    for name, row in result["parts"].items():
        mean = "-" if row["bits_per_byte"] is None else f"{row['bits_per_byte']:.3f}"
        lines.append(f"| {name} | {row['bytes']} | {mean} | {row['bpb_share']:.4f} |")
    return lines
