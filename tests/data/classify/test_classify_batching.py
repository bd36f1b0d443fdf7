"""Padded batches: ids, masks and labels exact; training order seeded and resumable bit for bit."""

import numpy as np
import pytest
import torch

from transformer_vq.data import DataError
from transformer_vq.data.classify import ClassBatches, Examples, ordered_batches, pad_batch
from transformer_vq.data.classify.examples import holdout

EXAMPLES = Examples.ragged([[5, 6, 7], [8], [], [1, 2, 3, 4, 9]], [1, 0, 2, 1])


def test_examples_views():
    assert len(EXAMPLES) == 4 and EXAMPLES.lengths.tolist() == [3, 1, 0, 5]
    tokens, label = EXAMPLES[3]
    assert tokens.tolist() == [1, 2, 3, 4, 9] and label == 1
    part = EXAMPLES.window(1, 4)
    assert [part[i][0].tolist() for i in range(3)] == [[8], [], [1, 2, 3, 4, 9]] and part.labels.tolist() == [0, 2, 1]
    fixed = Examples.fixed(np.arange(6, dtype=np.uint8).reshape(3, 2), [0, 1, 0])
    assert fixed[2][0].tolist() == [4, 5] and fixed.offsets.tolist() == [0, 2, 4, 6]
    train, validation = holdout(fixed, 1, "toy")
    assert (len(train), validation[0][0].tolist()) == (2, [4, 5])
    with pytest.raises(DataError, match=r"toy: validation_size must be between 1 and 2 \(the training set has 3 "
                                        r"examples\), got 3"):
        holdout(fixed, 3, "toy")
    with pytest.raises(ValueError, match=r"need len\(labels\) \+ 1 = 3 offsets, got 2"):
        Examples(np.zeros(2), np.array([0, 2]), np.array([0, 1]))


def test_pad_batch_to_longest_and_to_fixed_length():
    ids, mask, labels = pad_batch(EXAMPLES, [0, 1, 2], pad_id=15)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and labels.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [8, 15, 15], [15, 15, 15]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    assert labels.tolist() == [1, 0, 2]
    ids, mask, _ = pad_batch(EXAMPLES, [1], length=4)
    assert ids.tolist() == [[8, 0, 0, 0]] and mask.sum().item() == 1
    with pytest.raises(ValueError, match=r"a sequence of 5 tokens does not fit length=4"):
        pad_batch(EXAMPLES, [3], length=4)


def test_ordered_batches_visit_everything_once():
    batches = list(ordered_batches(EXAMPLES, 3))
    assert [b[2].tolist() for b in batches] == [[1, 0, 2], [1]]
    assert batches[1][0].tolist() == [[1, 2, 3, 4, 9]]


def drain(batches, n):
    return [next(batches) for _ in range(n)]


def test_class_batches_are_seeded_epoch_permutations_and_resume_bitwise():
    examples = Examples.ragged([[i] * (1 + i % 3) for i in range(10)], [i % 4 for i in range(10)])
    batches = ClassBatches(examples, batch_size=4, seed=7)
    assert batches.batches_per_epoch == 2
    first = drain(batches, 6)
    epoch0 = [int(x) for b in first[:2] for x in b[0][:, 0]]
    assert len(set(epoch0)) == 8  # 8 distinct examples in an epoch, the remainder dropped
    assert epoch0 != [int(x) for b in first[2:4] for x in b[0][:, 0]]  # a fresh order every epoch
    state = ClassBatches(examples, batch_size=4, seed=7)
    drain(state, 3)
    saved = state.state_dict()
    assert saved == {"epoch": 1, "index": 1, "seed": 7, "batch_size": 4, "n_examples": 10}
    resumed = ClassBatches(examples, batch_size=4, seed=7)
    resumed.load_state_dict(saved)
    for expected, got in zip(first[3:], drain(resumed, 3)):
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
    other = ClassBatches(examples, batch_size=4, seed=8)
    assert not torch.equal(next(other)[0], first[0][0]) or not torch.equal(next(other)[0], first[1][0])
    with pytest.raises(ValueError, match=r"it was saved with seed=7 but this run has seed=8"):
        other.load_state_dict(saved)


def test_ranks_read_disjoint_slices_of_the_global_batch():
    examples = Examples.ragged([[i] for i in range(12)], [0] * 12)
    whole = next(ClassBatches(examples, batch_size=4, seed=1))[0][:, 0].tolist()
    parts = [next(ClassBatches(examples, batch_size=4, seed=1, rank=r, world_size=2))[0][:, 0].tolist()
             for r in range(2)]
    assert parts[0] + parts[1] == whole
    with pytest.raises(ValueError, match=r"batch_size=3 must be a positive multiple of the number of data-parallel "
                                         r"workers \(2\)"):
        ClassBatches(examples, batch_size=3, world_size=2)
    with pytest.raises(ValueError, match=r"the split has 12 examples, fewer than one batch of 16"):
        ClassBatches(examples, batch_size=16)
