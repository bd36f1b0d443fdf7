"""Scoring the recall probe: accuracy by distance bucket (checked by hand and against a rule-based model whose reach
is known), its table, the `tvq eval` output, and a tiny training run (comparing models on it:
tests/bench/test_ablate_recall.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_vq.cli import main
from transformer_vq.config import RunConfig, TrainConfig, preset
from transformer_vq.data.recall import ASSIGN, load_recall
from transformer_vq.train import train
from transformer_vq.train.lm.recall import (accuracy_by_distance, bits_by_part, distance_bucket, recall_accuracy,
                                           recall_table)

def test_distance_buckets_are_powers_of_two_blocks():
    assert [distance_bucket(d, 32) for d in (0, 63, 64, 127, 128, 255, 256, 511, 512)] == [0, 0, 1, 1, 2, 2, 3, 3, 4]


def test_accuracy_by_distance_against_a_hand_computation():
    # L = 10: blocks 0, 1 | 2, 3 | 4 | 8 | - | 40  ->  buckets 0-2, 2-4, 4-8, 8-16, 16-32 (empty), 32-64
    rows = accuracy_by_distance([1, 0, 1, 1, 0, 1, 0], [5, 19, 20, 39, 45, 80, 400], block_len=10)
    assert [(r["bucket"], r["queries"], r["correct"], r["accuracy"]) for r in rows] == [
        ("0-2", 2, 1, 0.5), ("2-4", 2, 2, 1.0), ("4-8", 1, 0, 0.0), ("8-16", 1, 1, 1.0), ("16-32", 0, 0, None),
        ("32-64", 1, 0, 0.0)]
    assert (rows[5]["lo_blocks"], rows[5]["hi_blocks"], rows[0]["lo_blocks"]) == (32, 64, 0)
    with pytest.raises(ValueError, match=r"correct \(2,\) and distances \(3,\) must have the same shape"):
        accuracy_by_distance([1, 0], [1, 2, 3], 4)


@dataclass
class _Out:
    logits: torch.Tensor
    state: torch.Tensor


class LookbackModel(torch.nn.Module):
    """Recall by rule within a reach: after 'KEY=' it predicts the byte that followed the latest earlier 'KEY=' whose
    key lies at most ``reach`` positions back (the whole history is its carried state); anything else: byte 0."""

    def __init__(self, reach: int):
        super().__init__()
        self.reach = reach
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, state=None):
        history = input_ids if state is None else torch.cat([state, input_ids], dim=1)
        offset, logits = history.shape[1] - input_ids.shape[1], torch.zeros(*input_ids.shape, 256)
        for b, row in enumerate(history.tolist()):
            for p in range(offset, len(row)):
                if row[p] != ASSIGN:
                    continue
                key = row[p - 1]
                for q in range(p - 3, max(p - self.reach, 0) - 1, -1):  # the key at q, '=' at q + 1
                    if row[q] == key and row[q + 1] == ASSIGN and q + 2 < len(row):
                        logits[b, p - offset, row[q + 2]] = 1.0
                        break
        return _Out(logits=logits, state=history)


@pytest.mark.parametrize("reach", [40, 100, 10_000])
def test_recall_accuracy_of_a_model_with_a_known_reach(reach):
    corpus = load_recall(seq_len=256, n_pairs=6, train_episodes=1, eval_episodes=6, seed=2)
    result = recall_accuracy(LookbackModel(reach), corpus, "test", block_len=16, window_len=48, batch_size=4)
    # the pair's key sits at value_pos - 2 and the query's '=' at answer_pos - 1: in reach iff distance <= reach - 1
    from transformer_vq.data.recall import recall_episode, spec_of

    distances = np.concatenate([recall_episode(spec_of(corpus), 2, "test", i).distances for i in range(6)])
    # bits per answer byte: a recalled byte has logit 1 against 255 zeros, any other answer a uniform guess (8 bits)
    recalled = distances <= reach - 1
    bits = np.where(recalled, -np.log2(np.e / (np.e + 255)), 8.0)[:, None]
    expected = accuracy_by_distance(recalled, distances, 16, bits)
    assert [{k: v for k, v in row.items() if k != "answer_bpb"} for row in result.buckets] == \
        [{k: v for k, v in row.items() if k != "answer_bpb"} for row in expected]
    for row, want in zip(result.buckets, expected):
        assert (row["answer_bpb"] is None) == (want["answer_bpb"] is None)
        assert row["answer_bpb"] is None or abs(row["answer_bpb"] - want["answer_bpb"]) < 1e-12
    assert abs(result.answer_bpb - float(bits.mean())) < 1e-12
    assert result.accuracy == pytest.approx(float(np.mean(distances <= reach - 1)))
    assert (result.episodes, result.chance, result.block_len) == (6, 0.1, 16)
    if reach == 10_000:
        assert result.accuracy == 1.0
    # every byte but a recalled answer is a uniform guess over 256 bytes: 8 bits; the parts add up to the whole
    parts, spec = result.parts, spec_of(corpus)
    assert [parts[name]["bits_per_byte"] for name in ("pairs", "filler", "queries")] == [8.0, 8.0, 8.0]
    assert abs(parts["answers"]["bits_per_byte"] - result.answer_bpb) < 1e-12
    assert (parts["pairs"]["bytes"], parts["queries"]["bytes"], parts["answers"]["bytes"]) == (
        6 * (spec.pairs_end - 1), 6 * spec.n_queries * (spec.key_len + 2), 6 * spec.n_queries * spec.value_len)
    assert sum(row["bytes"] for row in parts.values()) == 6 * (spec.seq_len - 1)
    assert abs(sum(row["bpb_share"] for row in parts.values()) - result.bpb) < 1e-12
    # the state carries the history across windows: the window length changes nothing
    assert recall_accuracy(LookbackModel(reach), corpus, "test", block_len=16, window_len=256).buckets == result.buckets


def test_recall_table():
    result = {"split": "test", "episodes": 3, "block_len": 32, "chance": 0.1, "accuracy": 0.75,
              "buckets": accuracy_by_distance([1, 1, 1, 0], [5, 70, 80, 300], 32)}
    assert recall_table(result) == "\n".join([
        "recall accuracy by distance (blocks of L = 32; 3 episodes of test; chance 10.0%)", "",
        "| distance (blocks) | queries | accuracy |", "|---|---:|---:|",
        "| 0-2 | 1 | 100.0% |", "| 2-4 | 2 | 100.0% |", "| 4-8 | 0 | - |", "| 8-16 | 1 | 0.0% |",
        "| all | 4 | 75.0% |"])


def _tiny_recall_config(run_dir: Path, **model) -> RunConfig:
    return RunConfig(model=preset("tiny", **model), train=TrainConfig(
        data="recall", data_options={"n_pairs": 4, "train_episodes": 4, "eval_episodes": 2}, seq_len=128,
        update_len=32, batch_size=2, steps=6, sample_tokens=0, run_dir=str(run_dir), ckpt_every=6, warmup_steps=1))


def test_training_and_tvq_eval_on_the_probe(tmp_path, capsys):
    result = train(_tiny_recall_config(tmp_path / "run"))
    assert result.exit_code == 0 and result.step == 6
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(tmp_path / "run"), "--split", "test", "--json"]) == 0
    recall = json.loads(capsys.readouterr().out)["recall"]
    assert (recall["split"], recall["episodes"], recall["block_len"], recall["chance"]) == ("test", 2, 8, 0.1)
    assert sum(b["queries"] for b in recall["buckets"]) == 8 and 0.0 <= recall["accuracy"] <= 1.0
    assert main(["eval", "--ckpt", str(tmp_path / "run"), "--max-tokens", "130"]) == 0
    text = capsys.readouterr().out
    assert "recall accuracy by distance (blocks of L = 8; 2 episodes of validation; chance 10.0%)" in text
    assert "| distance (blocks) | queries | accuracy |" in text


def test_bits_per_answer_byte_by_distance_and_in_the_table():
    bits = [[1.0, 3.0], [2.0, 2.0], [8.0, 8.0]]  # three queries of two answer bytes
    rows = accuracy_by_distance([1, 1, 0], [5, 10, 300], 32, bits)
    assert [row["answer_bpb"] for row in rows] == [2.0, None, None, 8.0]
    with pytest.raises(ValueError, match=r"must be \[queries, value_len\] with 3 queries"):
        accuracy_by_distance([1, 1, 0], [5, 10, 300], 32, [1.0, 2.0, 3.0])
    result = {"split": "test", "episodes": 1, "block_len": 32, "chance": 0.01, "accuracy": 2 / 3,
              "answer_bpb": 4.0, "buckets": rows}
    assert recall_table(result).splitlines()[2:5] == [
        "| distance (blocks) | queries | accuracy | answer bits/byte |", "|---|---:|---:|---:|",
        "| 0-2 | 2 | 100.0% | 2.000 |"]
    assert recall_table(result).splitlines()[-1] == "| all | 3 | 66.7% | 4.000 |"


def test_bits_by_part_splits_the_bits_per_byte():
    parts = [0, 0, 1, 2, 3, 1]
    bits = [float("nan"), 2.0, 1.0, 4.0, 6.0, 3.0]  # the first byte is not predicted
    rows = bits_by_part(parts, bits)
    assert rows == {"pairs": {"bytes": 1, "bits_per_byte": 2.0, "bpb_share": 2.0 / 5},
                    "filler": {"bytes": 2, "bits_per_byte": 2.0, "bpb_share": 4.0 / 5},
                    "queries": {"bytes": 1, "bits_per_byte": 4.0, "bpb_share": 4.0 / 5},
                    "answers": {"bytes": 1, "bits_per_byte": 6.0, "bpb_share": 6.0 / 5}}
    assert sum(r["bpb_share"] for r in rows.values()) == 16.0 / 5
    with pytest.raises(ValueError, match="must have the same shape"):
        bits_by_part([0, 1], [1.0])
    result = {"split": "test", "episodes": 1, "block_len": 32, "chance": 0.1, "accuracy": 1.0,
              "buckets": accuracy_by_distance([1], [5], 32), "bpb": 3.2, "parts": rows}
    assert recall_table(result).splitlines()[-8:] == [
        "bits by kind of byte (the shares add up to 3.2000 bits per byte over every byte but each episode's first)", "",
        "| part | bytes | bits/byte | share of bits per byte |", "|---|---:|---:|---:|",
        "| pairs | 1 | 2.000 | 0.4000 |", "| filler | 2 | 2.000 | 0.8000 |", "| queries | 1 | 4.000 | 0.8000 |",
        "| answers | 1 | 6.000 | 1.2000 |"]
