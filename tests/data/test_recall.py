"""The recall probe's data: deterministic episodes whose answers are the values of their keys, at the recorded
distances, one episode per training sequence."""

from __future__ import annotations

import re

import numpy as np
import pytest

from transformer_vq.config import TrainConfig
from transformer_vq.data import DataError, load_corpus
from transformer_vq.data.batches import corpus_batches
from transformer_vq.data.recall import (ASSIGN, END, FILLER, HEADER, PARTS, QUERY, VALUES, RecallSpec, episode_parts,
                                        load_recall, recall_episode, recall_split, spec_of, stored_episode)
from transformer_vq.data.registry import list_corpora, list_probes
from transformer_vq.train.lm.build import load_corpus_for


def test_episodes_are_a_function_of_seed_split_and_index():
    spec = RecallSpec(seq_len=256)
    first, again = recall_episode(spec, 3, "train", 5), recall_episode(spec, 3, "train", 5)
    assert np.array_equal(first.tokens, again.tokens) and np.array_equal(first.answer_pos, again.answer_pos)
    for other in (recall_episode(spec, 3, "train", 6), recall_episode(spec, 4, "train", 5),
                  recall_episode(spec, 3, "validation", 5)):
        assert not np.array_equal(first.tokens, other.tokens)
    # a split is its episodes back to back, so any episode can be regenerated alone
    assert np.array_equal(recall_split(spec, 3, "train", 7)[5 * 256:6 * 256], first.tokens)


def test_a_hand_checked_episode():
    e = recall_episode(RecallSpec(seq_len=64, n_pairs=2, n_queries=2), 0, "train", 0)
    text = bytes(e.tokens).decode()
    assert len(text) == 64 and text.startswith("#") and text.count("?") == 2
    pairs = dict(item.split("=") for item in text[1:9].rstrip(";").split(";"))  # '#K=V;K=V;'
    for start in (text.index("?"), text.rindex("?")):
        key, value = text[start + 1], text[start + 3]
        assert text[start + 2] == "=" and text[start + 4] == ";" and pairs[key] == value


@pytest.mark.parametrize("spec", [RecallSpec(seq_len=512), RecallSpec(seq_len=300, n_pairs=12, n_queries=5,
                                                                       key_len=2, value_len=3, filler="random")])
def test_answers_are_the_values_of_their_keys_at_the_recorded_distances(spec):
    for index in range(20):
        e = recall_episode(spec, 1, "test", index)
        t = e.tokens
        assert e.answer_pos.shape == e.value_pos.shape == (spec.n_queries, spec.value_len)
        assert np.array_equal(t[e.answer_pos], t[e.value_pos])  # the answer is the pair's value
        kl = spec.key_len
        for answer, value in zip(e.answer_pos[:, 0], e.value_pos[:, 0]):
            # ... of the same key: '?KEY=' before the answer, 'KEY=' before the value
            assert t[answer - kl - 2] == QUERY and t[answer - 1] == ASSIGN == t[value - 1]
            assert np.array_equal(t[answer - kl - 1:answer - 1], t[value - kl - 1:value - 1])
            assert t[answer + spec.value_len] == END
        assert np.array_equal(e.distances, e.answer_pos[:, 0] - e.value_pos[:, 0]) and (e.distances > 0).all()
        assert len(set(e.value_pos[:, 0])) == spec.n_queries  # every key asked once
        assert t[0] == HEADER and (t[1:spec.pairs_end] == QUERY).sum() == 0
        assert (t == QUERY).sum() == spec.n_queries  # queries never overlap
        keys = t[spec.pairs_end - spec.n_pairs * spec.pair_len:spec.pairs_end].reshape(spec.n_pairs, -1)[:, :kl]
        assert len({bytes(k) for k in keys}) == spec.n_pairs  # distinct keys


@pytest.mark.parametrize("spec", [RecallSpec(seq_len=512), RecallSpec(seq_len=300, n_pairs=12, n_queries=5,
                                                                       key_len=2, value_len=3, filler="random")])
def test_episode_parts_name_every_byte_by_what_it_is(spec):
    for index in range(10):
        e = recall_episode(spec, 2, "validation", index)
        parts, t = episode_parts(spec, e), e.tokens
        assert parts.shape == t.shape
        by_name = {name: t[parts == i] for i, name in enumerate(PARTS)}
        assert (parts[:spec.pairs_end] == PARTS.index("pairs")).all() and by_name["pairs"][0] == HEADER
        assert np.isin(by_name["answers"], VALUES).all() and len(by_name["answers"]) == spec.n_queries * spec.value_len
        # each query's '?', key and '=' (key_len + 2 bytes), nothing else
        queries = by_name["queries"].reshape(spec.n_queries, spec.key_len + 2)
        assert (queries[:, 0] == QUERY).all() and (queries[:, -1] == ASSIGN).all()
        # the filler holds filler letters and the ';' closing each query
        assert np.isin(by_name["filler"], np.append(FILLER, END)).all()
        assert (by_name["filler"] == END).sum() == spec.n_queries


def test_pattern_filler_repeats_its_phrase_and_distances_spread_over_buckets():
    spec = RecallSpec(seq_len=2048, phrase_len=16)
    e = recall_episode(spec, 0, "train", 0)
    free = np.ones(spec.seq_len, dtype=bool)
    free[:spec.pairs_end] = False
    for start in e.answer_pos[:, 0] - spec.key_len - 2:
        free[start:start + spec.query_len] = False
    positions = np.flatnonzero(free)
    phrase = {p % 16: e.tokens[p] for p in positions}
    assert all(e.tokens[p] == phrase[p % 16] for p in positions)
    distances = np.concatenate([recall_episode(spec, 0, "train", i).distances for i in range(40)])
    blocks = distances // 32
    # the log-uniform offsets reach every power-of-two bucket up to 32-64 blocks of 32
    counts = [int(((blocks >= lo) & (blocks < 2 * lo)).sum()) for lo in (2, 4, 8, 16, 32)]
    assert min(counts) >= 15 and int((blocks < 2).sum()) >= 15 and distances.max() < 2048


@pytest.mark.parametrize("options, fragment", [
    ({"n_pairs": 4, "n_queries": 5}, "n_queries=5 exceeds n_pairs=4"),
    ({"n_pairs": 27}, "needs more distinct keys than 26**key_len=26; raise key_len"),
    ({"seq_len": 40}, "seq_len=40 is too short for 8 pairs and 8 queries (needs at least 74)"),
    ({"filler": "noise"}, "filler must be one of pattern, random, text, got 'noise'"),
    ({"value_len": 0}, "value_len must be a positive integer, got 0"),
    ({"eval_episodes": 0}, "validation needs at least one episode, got 0"),
])
def test_bad_options_are_clear_errors(options, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)):
        load_recall(**{"train_episodes": 1, "eval_episodes": 1, **options})


def test_the_corpus_and_its_training_sequences():
    assert "recall" in list_probes() and "recall" not in list_corpora()
    with pytest.raises(DataError, match="reads no files; leave --data-path out"):
        load_corpus("recall", data_path="x")
    corpus = load_corpus("recall", seq_len=128, n_pairs=4, train_episodes=6, eval_episodes=2, seed=9)
    assert {k: len(v) for k, v in corpus.splits.items()} == {"train": 768, "validation": 256, "test": 256}
    assert corpus.vocab_size == 256 and list(corpus.documents["test"]) == [0, 128]
    assert spec_of(corpus) == RecallSpec(seq_len=128, n_pairs=4, n_queries=4) and corpus.metadata["seed"] == 9
    # every training row is one whole episode (plus the next one's header byte as the last target)
    batches = corpus_batches(corpus, "train", batch_size=2, seq_len=128, seed=0)
    for _ in range(3):
        for row in next(batches).numpy():
            index = next(i for i in range(6) if np.array_equal(recall_episode(spec_of(corpus), 9, "train", i).tokens,
                                                               row[:128]))
            assert row[128] == HEADER and index >= 0


def test_training_passes_its_seq_len_to_the_probe():
    cfg = TrainConfig(data="recall", seq_len=96, update_len=32, data_options={"n_pairs": 2, "train_episodes": 3,
                                                                            "eval_episodes": 1})
    corpus = load_corpus_for(cfg)
    assert spec_of(corpus).seq_len == 96 and len(corpus.splits["train"]) == 3 * 96


# The text filler: the recall task mixed into real text (its text is injected here, so no download is needed).

# each split's text has letters of its own (a-h, i-p, q-z), and the bytes that clean_text must replace
TEXTS = {"train": b"Bad Cafe; 2 Dead? = # head, beg.\n" * 60,
         "validation": b"Mink Jip? 5 Lol; = # pin, milk.\n" * 60,
         "test": b"Rusty Zux; 9 vs Qwq? = # tux.\n" * 60}
LETTERS = {"train": set(b"abcdefgh"), "validation": set(b"ijklmnop"), "test": set(b"qrstuvwxyz")}


@pytest.fixture
def injected_text(monkeypatch):
    import transformer_vq.data.recall as recall

    cleaned = {split: recall.clean_text(np.frombuffer(text, dtype=np.uint8)) for split, text in TEXTS.items()}
    monkeypatch.setattr(recall, "filler_text", lambda cache_dir=None: cleaned)
    return cleaned


def test_clean_text_keeps_text_and_leaves_the_probe_its_own_bytes():
    from transformer_vq.data.recall import KEYS, VALUES, clean_text

    cleaned = bytes(clean_text(np.frombuffer(b"What? 3 Acts; A=B #1, ok.\n", dtype=np.uint8)))
    assert cleaned == b"what.   acts, a b   , ok.\n"
    assert not set(cleaned) & set(KEYS.tolist() + VALUES.tolist() + [HEADER, ASSIGN, END, QUERY])


def _free_positions(spec, episode):
    """Positions of an episode that hold filler (neither the pairs region nor a query)."""
    free = np.ones(spec.seq_len, dtype=bool)
    free[:spec.pairs_end] = False
    for start in episode.answer_pos[:, 0] - spec.key_len - 2:
        free[start:start + spec.query_len] = False
    return np.flatnonzero(free)


def test_text_episodes_are_deterministic_with_the_text_where_the_filler_is(injected_text):
    from transformer_vq.data.recall import text_filler

    corpus = load_recall(seq_len=512, n_pairs=26, value_len=3, filler="text", train_episodes=5, eval_episodes=3,
                         seed=4)
    again = load_recall(seq_len=512, n_pairs=26, value_len=3, filler="text", train_episodes=5, eval_episodes=3,
                        seed=4)
    spec = spec_of(corpus)
    assert all(np.array_equal(corpus.splits[s], again.splits[s]) for s in corpus.splits)
    assert corpus.metadata["filler_text"]["bytes"] == {s: len(t) for s, t in injected_text.items()}
    for split, count in corpus.metadata["episodes"].items():
        for index in range(count):
            e = stored_episode(corpus, split, index)
            filler = text_filler(injected_text[split], 512, 4, split, index)
            # the filler is a contiguous run of the split's own text, kept wherever no pair or query is written
            assert bytes(filler) in bytes(injected_text[split])
            free = _free_positions(spec, e)
            assert np.array_equal(e.tokens[free], filler[free]) and len(free) == spec.free_room
            # the answers are where they say they are: the values of their keys, asked once each
            assert np.array_equal(e.tokens[e.answer_pos], e.tokens[e.value_pos])
            assert (e.tokens == QUERY).sum() == spec.n_queries and np.all(e.tokens[e.answer_pos[:, 0] - 1] == ASSIGN)
            # the layout does not depend on the text: other filler bytes give the same pairs and queries
            layout = recall_episode(spec, 4, split, index, np.full(512, ord("x"), dtype=np.uint8))
            assert np.array_equal(layout.answer_pos, e.answer_pos) and np.array_equal(layout.value_pos, e.value_pos)


def test_no_validation_or_test_text_in_training_episodes(injected_text):
    corpus = load_recall(seq_len=256, n_pairs=4, filler="text", train_episodes=20, eval_episodes=20, seed=1)
    spec = spec_of(corpus)
    for split, count in corpus.metadata["episodes"].items():
        others = set().union(*(letters for name, letters in LETTERS.items() if name != split))
        for index in range(count):
            filler = set(stored_episode(corpus, split, index).tokens[_free_positions(spec, stored_episode(
                corpus, split, index))].tolist())
            assert filler & LETTERS[split] and not filler & others  # the split's own text, and only it


@pytest.mark.parametrize("options, fragment", [
    ({"filler": "text", "phrase_len": 8}, "phrase_len is the pattern filler's; filler 'text' has no phrase"),
    ({"filler": "random", "phrase_len": 8}, "phrase_len is the pattern filler's; filler 'random' has no phrase"),
    ({"filler": "text", "seq_len": 4096}, "the train text (1980 bytes) is shorter than one episode (4096)"),
])
def test_bad_text_filler_options_are_clear_errors(injected_text, options, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)):
        load_recall(**{"train_episodes": 1, "eval_episodes": 1, **options})


def test_filler_bytes_are_given_for_the_text_filler_only():
    with pytest.raises(DataError, match="filler is 'text' and filler bytes were not given"):
        recall_episode(RecallSpec(seq_len=128, filler="text"), 0, "train", 0)
    with pytest.raises(DataError, match="filler is 'pattern' and filler bytes were given"):
        recall_episode(RecallSpec(seq_len=128), 0, "train", 0, np.zeros(128, np.uint8))
    with pytest.raises(DataError, match="text filler must be 128 bytes"):
        recall_episode(RecallSpec(seq_len=128, filler="text"), 0, "train", 0, np.zeros(100, np.uint8))
