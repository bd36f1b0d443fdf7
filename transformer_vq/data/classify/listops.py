"""ListOps (Nangia & Bowman, 2018) as Long Range Arena specifies it: the grammar, a seeded
generator and an evaluator.

An expression is a digit ``0``-``9`` or an operator applied to 2..``max_args`` expressions,
written ``[OP a b ... ]``. The operators are ``[MIN``, ``[MAX``, ``[MED`` (the median; for an
even count the mean of the middle two, rounded down, as ``int(numpy.median(...))`` in LRA) and
``[SM`` (the sum modulo 10). The label is the expression's value, one of 10 classes.

Tokens (vocabulary 16): ``0`` is padding, digits ``d`` are ``d + 1``, then ``[MIN`` 11, ``[MAX`` 12,
``[MED`` 13, ``[SM`` 14 and ``]`` 15. LRA's released TSV files also wrap every operator
application in round brackets -- an artifact of how its generator binarized the tree; they carry no
information and are dropped (as most LRA implementations do), so lengths count only the tokens above.

The generator follows LRA's: a node at depth ``d < max_depth`` is a digit with probability 0.75
and otherwise an operator (uniformly one of the four) with ``randint(2, max_args)`` children; at
``max_depth`` it is a digit. An expression is kept when ``min_length < length < max_length``
(LRA: depth 10, 10 arguments, 500 < length < 2,000) and not already drawn; kept expressions fill
train, then validation, then test. The label is computed from the token list by
:func:`evaluate`, independently of the tree the generator built.
"""

from __future__ import annotations

import random

import numpy as np

from transformer_vq.data.errors import DataError
from transformer_vq.data.progress import Advance, no_progress

PAD_ID = 0
DIGITS = tuple(str(d) for d in range(10))
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
VOCAB = ("<pad>",) + DIGITS + OPERATORS + (CLOSE,)
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
LAST_DIGIT_ID, CLOSE_ID = TOKEN_ID[DIGITS[-1]], TOKEN_ID[CLOSE]  # digits are 1..LAST_DIGIT_ID, operators up to CLOSE_ID
N_CLASSES = 10
VALUE_P = 0.25  # LRA: a node below max_depth is an operator when random() <= VALUE_P


class TooLong(Exception):
    """Raised inside the generator once an expression reaches ``max_length`` (it would be rejected)."""


def apply(operator: str, values: list[int]) -> int:
    """The value of ``operator`` (one of :data:`OPERATORS`) on ``values``: LRA's ``to_value``, whose results are
    the labels of its released files, so that a release's every label can be checked against it."""
    if operator == "[MIN":
        return min(values)
    if operator == "[MAX":
        return max(values)
    if operator == "[SM":
        return sum(values) % 10
    ordered = sorted(values)
    middle = len(ordered) // 2
    # LRA's int(np.median(values)): for an even count the mean of the middle two, truncated, which is its floor for
    # digits; integer arithmetic instead of numpy's float mean, same value
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def evaluate(ids) -> int:
    """The value of the expression written as token ids (a stack machine over the tokens).

    Raises ``ValueError`` for a malformed expression (unbalanced brackets, an operator without
    arguments, an unknown id, a trailing token). It checks every line of a released file, so the loop
    is kept to plain comparisons on Python ints: about 0.2 ms for an expression of 1,000 tokens.
    """
    ids = ids.tolist() if isinstance(ids, np.ndarray) else ids  # numpy scalars would slow the loop several times
    enclosing: list[tuple[str | None, list[int]]] = []
    operator, values = None, []  # the innermost open operator (None: the top level) and its arguments so far
    for position, token_id in enumerate(ids):
        if 0 < token_id <= LAST_DIGIT_ID:
            values.append(token_id - 1)
        elif token_id == CLOSE_ID:
            if operator is None or not values:
                raise ValueError(f"token {position} closes no operator with arguments")
            value = apply(operator, values)
            operator, values = enclosing.pop()
            values.append(value)
        elif LAST_DIGIT_ID < token_id < CLOSE_ID:
            enclosing.append((operator, values))
            operator, values = VOCAB[token_id], []
        else:
            raise ValueError(f"token {position} has id {token_id}, not a ListOps token")
    if operator is not None:
        raise ValueError("the expression is incomplete (an operator is not closed)")
    if len(values) != 1:
        raise ValueError("a token follows a complete expression" if values else "the expression is empty")
    return values[0]


def generate_tokens(rng: random.Random, max_depth: int, max_args: int, max_length: int) -> list[int]:
    """One expression drawn as LRA's generator draws it, as token ids (``TooLong`` past ``max_length``)."""
    out: list[int] = []

    def node(depth: int) -> None:
        if len(out) >= max_length:
            raise TooLong
        if depth >= max_depth or rng.random() > VALUE_P:
            out.append(TOKEN_ID[DIGITS[rng.randrange(10)]])
            return
        n_args = rng.randint(2, max_args)
        out.append(TOKEN_ID[rng.choice(OPERATORS)])
        for _ in range(n_args):
            node(depth + 1)
        out.append(TOKEN_ID[CLOSE])

    node(1)
    if len(out) >= max_length:
        raise TooLong
    return out


def generate(n: int, *, seed: int, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
             max_length: int = 2000, advance: Advance = no_progress) -> list[np.ndarray]:
    """``n`` distinct expressions (``uint8`` token ids) with ``min_length < length < max_length``, seeded
    (``advance`` counts them as they are kept)."""
    if max_args < 2 or max_depth < 2 or not 0 <= min_length < max_length - 1:
        raise DataError(f"listops needs max_args >= 2, max_depth >= 2 and 0 <= min_length < max_length - 1; got "
                        f"max_args={max_args}, max_depth={max_depth}, min_length={min_length}, "
                        f"max_length={max_length}")
    rng = random.Random(seed)
    seen: set[bytes] = set()
    kept: list[np.ndarray] = []
    attempts = 0
    while len(kept) < n:
        attempts += 1
        if attempts > 1000 * (n + 100):
            raise DataError(f"listops: only {len(kept)} distinct expressions of {min_length} < length < "
                            f"{max_length} found in {attempts - 1} draws; widen the length range or raise max_depth")
        try:
            tokens = generate_tokens(rng, max_depth, max_args, max_length)
        except TooLong:
            continue
        key = bytes(tokens)
        if len(tokens) > min_length and key not in seen:
            seen.add(key)
            kept.append(np.frombuffer(key, dtype=np.uint8))  # a byte per token: 100,000 expressions in ~100 MB
            advance(1)
    return kept


def encode(source: str) -> list[int]:
    """Token ids of an expression in LRA's text form (round brackets are dropped).

    Raises ``KeyError`` naming the first unknown token.
    """
    return [TOKEN_ID[token] for token in source.replace("(", " ").replace(")", " ").split()]


def decode(ids) -> str:
    """The text of token ids (padding left out)."""
    return " ".join(VOCAB[int(i)] for i in ids if int(i) != PAD_ID)


def labelled(sequences: list) -> np.ndarray:
    """The labels (values) of generated expressions, by :func:`evaluate`."""
    return np.array([evaluate(tokens) for tokens in sequences], dtype=np.int64)
