"""ListOps: the generator follows LRA's limits, is seeded, and its labels agree with a second evaluator."""

import statistics

import numpy as np
import pytest

from transformer_vq.data import DataError
from transformer_vq.data.classify import listops, load_classification

SMALL = dict(n_train=40, n_validation=8, n_test=8, min_length=10, max_length=120, max_depth=6, max_args=5)


def recursive_value(words: list[str]) -> int:
    """A second evaluator: recursive descent over the token strings (stdlib statistics, not listops.apply)."""
    def parse(i: int) -> tuple[int, int]:
        if words[i].isdigit():
            return int(words[i]), i + 1
        operator, args, i = words[i], [], i + 1
        while words[i] != "]":
            value, i = parse(i)
            args.append(value)
        reduce = {"[MIN": min, "[MAX": max, "[SM": lambda a: sum(a) % 10,
                  "[MED": lambda a: int(statistics.median(a))}[operator]
        return reduce(args), i + 1

    value, end = parse(0)
    assert end == len(words)
    return value


def test_grammar_and_evaluator_on_known_expressions():
    assert listops.VOCAB == ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MIN", "[MAX", "[MED",
                             "[SM", "]")
    ids = listops.encode("( ( ( ( [MAX 2 ) 9 ) ( ( [MIN 4 7 ) ] ) ) 0 ) ]")  # LRA text form, brackets dropped
    assert listops.decode(ids) == "[MAX 2 9 [MIN 4 7 ] 0 ]"
    assert listops.evaluate(ids) == 9
    assert listops.evaluate(listops.encode("[MED 1 2 3 8 ]")) == 2  # even count: floor((2 + 3) / 2)
    assert listops.evaluate(listops.encode("[SM 9 9 [MED 7 ] ]")) == 5
    for bad, message in [("[MAX 1 2", "incomplete"), ("1 2", "follows a complete"), ("[MIN ]", "closes no operator")]:
        with pytest.raises(ValueError, match=message):
            listops.evaluate(listops.encode(bad))


def test_generated_splits_are_seeded_limited_distinct_and_correctly_labelled(tmp_path):
    data = load_classification("listops", seed=3, **SMALL)
    assert (data.vocab_size, data.n_classes, data.max_len, data.pad_id) == (16, 10, 119, 0)
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [40, 8, 8]
    seen = set()
    for split in ("train", "validation", "test"):
        examples = data.splits[split]
        assert examples.lengths.min() > 10 and examples.lengths.max() < 120
        for i in range(len(examples)):
            tokens, label = examples[i]
            words = listops.decode(tokens).split()
            assert label == recursive_value(words)
            depth = max(np.cumsum([1 if w.startswith("[") else -1 if w == "]" else 0 for w in words]))
            assert depth <= 5  # max_depth=6 counts the leaves' level too
            counts = argument_counts(words)
            assert min(counts) >= 2 and max(counts) <= 5
            seen.add(bytes(tokens))
    assert len(seen) == 56  # distinct across splits
    again = load_classification("listops", seed=3, cache_dir=tmp_path / "elsewhere", **SMALL)
    other = load_classification("listops", seed=4, **SMALL)
    assert np.array_equal(np.asarray(again.splits["train"].tokens), np.asarray(data.splits["train"].tokens))
    assert not np.array_equal(np.asarray(other.splits["train"].tokens[:50]),
                              np.asarray(data.splits["train"].tokens[:50]))


def argument_counts(words: list[str]) -> list[int]:
    """How many arguments each operator application has (a stack of counters over the words)."""
    stack, counts = [], []
    for w in words:
        if w == "]":
            counts.append(stack.pop())
        if stack and w != "]":
            stack[-1] += 1
        if w.startswith("["):
            stack.append(0)
    return counts


def test_generated_sequence_is_lras_draw():
    """The first expression of seed 0 pins the generator's use of the random stream."""
    tokens = listops.generate(1, seed=0, min_length=12, max_length=40, max_depth=4, max_args=4)[0]
    assert listops.decode(tokens) == "[MIN [MAX [SM 1 1 ] 8 7 [MED 1 8 5 8 ] ] [MED 9 5 4 [MIN 9 4 ] ] 1 ]"
    assert listops.evaluate(tokens) == 1  # min(max(2, 8, 7, 6), median(9, 5, 4, 4) = 4, 1)


def write_tsv(path, rows, header="Source\tTarget"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "".join(f"{source}\t{target}\n" for source, target in rows))


def test_release_tsv_files_load(tmp_path):
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 5 ) 8 ) ] )", 3), ("( ( [MIN 4 ) 1 ] )", 1)]
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        write_tsv(tmp_path / "listops-1000" / name, rows)
    data = load_classification("listops", data_path=tmp_path)
    tokens, label = data.splits["validation"][1]
    assert (listops.decode(tokens), label) == ("[SM 5 8 ]", 3)
    assert data.max_len == 4 and list(data.splits["test"].labels) == [9, 3, 1]


@pytest.mark.parametrize("content, message", [
    ("Source,Target\n", r"the first line is 'Source,Target', expected the header 'Source<TAB>Target'"),
    ("Source\tTarget\n[MAX 1 ]\t1\textra\n", r"basic_train.tsv:2: expected 2 tab-separated fields, got 3"),
    ("Source\tTarget\n[MAX 1 [FIRST 2 ] ]\t1\n", r"basic_train.tsv:2: unknown ListOps token '\[FIRST'"),
    ("Source\tTarget\n[MAX 1 ]\t12\n", r"basic_train.tsv:2: the target '12' is not a digit 0-9"),
    # a digit to str.isdigit() that int() refuses: once a bare ValueError without the file
    ("Source\tTarget\n[MAX 2 2 ]\t\u00b2\n", r"basic_train.tsv:2: the target '\u00b2' is not a digit 0-9"),
    ("Source\tTarget\n", r"basic_train.tsv holds no examples"),
    # a damaged or truncated file: the expression is checked, and its label against its value
    ("Source\tTarget\n[MAX 2 9\t9\n", r"basic_train.tsv:2: the expression is malformed: the expression is "
                                      r"incomplete \(an operator is not closed\)"),
    ("Source\tTarget\n( ( [MAX 2 ) 9 )\t9\n", r"basic_train.tsv:2: the expression is malformed: the expression is "
                                              r"incomplete"),
    ("Source\tTarget\n[MAX 2 9 ] ]\t9\n", r"basic_train.tsv:2: the expression is malformed: token 4 closes no "
                                          r"operator with arguments"),
    ("Source\tTarget\n[MAX 2 9 ] 2\t9\n", r"basic_train.tsv:2: .*: a token follows a complete expression"),
    ("Source\tTarget\n\t3\n", r"basic_train.tsv:2: the expression is malformed: the expression is empty"),
    ("Source\tTarget\n[MAX 2 9 ]\t9\n[MAX 2 9 ]\t3\n", r"basic_train.tsv:3: the target is 3, but the expression's "
                                                      r"value is 9 \(a label of the release is its expression's "
                                                      r"value\); pass --data-path"),
])
def test_malformed_release_files(tmp_path, content, message):
    write_tsv(tmp_path / "basic_val.tsv", [("[MAX 1 ]", 1)])
    write_tsv(tmp_path / "basic_test.tsv", [("[MAX 1 ]", 1)])
    (tmp_path / "basic_train.tsv").write_text(content)
    with pytest.raises(DataError, match=message):
        load_classification("listops", data_path=tmp_path)


def test_missing_release_file_and_bad_options(tmp_path):
    write_tsv(tmp_path / "basic_train.tsv", [("[MAX 1 ]", 1)])
    with pytest.raises(DataError, match=r"no basic_val.tsv under .*; pass --data-path with the directory of LRA's "
                                        r"listops-1000 release"):
        load_classification("listops", data_path=tmp_path)
    with pytest.raises(DataError) as caught:
        load_classification("listops", max_args=1)
    assert str(caught.value) == ("dataset 'listops': option max_args must be >= 2, got 1; pass --data-option "
                                 "max_args=VALUE with such a value, or leave it out (default 10)")
    with pytest.raises(DataError, match=r"only 0 distinct expressions of 50 < length < 60 found"):
        listops.generate(1, seed=0, min_length=50, max_length=60, max_depth=2, max_args=3)


@pytest.mark.parametrize("source, value", [
    ("( ( ( ( ( [MED 1 ) 2 ) 3 ) 8 ) ] )", 2),  # LRA's int(np.median): 2.5 truncated, not rounded
    ("( ( ( ( [MED 9 ) 8 ) 1 ) ] )", 8),
    ("( ( ( [SM 9 ) 9 ) ] )", 8),  # the sum modulo 10
    ("( ( ( [MIN 3 ) ( ( ( [MAX 0 ) 7 ) ] ) ) ] )", 3),
])
def test_release_labels_are_checked_with_lras_semantics(tmp_path, source, value):
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        write_tsv(tmp_path / name, [(source, value)])
    assert list(load_classification("listops", data_path=tmp_path).splits["train"].labels) == [value]
    (tmp_path / "basic_train.tsv").write_text(f"Source\tTarget\n{source}\t{(value + 1) % 10}\n")
    with pytest.raises(DataError, match=rf"basic_train.tsv:2: the target is {(value + 1) % 10}, but the "
                                        rf"expression's value is {value}"):
        load_classification("listops", data_path=tmp_path)
