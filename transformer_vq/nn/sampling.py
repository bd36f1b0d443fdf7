"""Choosing the next token from logits: temperature, top-k and nucleus (top-p) sampling."""

from __future__ import annotations

import functools

import torch

from transformer_vq.config import ConfigError, SampleConfig


def check_sampling(temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0) -> None:
    """Refuse (``ValueError``) sampling settings that ``tvq sample`` refuses, by the same rules: the fields of
    :class:`~transformer_vq.config.SampleConfig` (temperature >= 0, ``top_k`` >= 0 where 0 is every token as in
    transformers, ``top_p`` in (0, 1], and ``top_k``/``top_p`` only with a temperature above 0: greedy decoding
    restricts nothing)."""
    try:
        _check_remembered(temperature, top_k, top_p)
    except TypeError:  # unhashable (a list): not remembered, and refused by the same rules
        _check(temperature, top_k, top_p)


def _check(temperature, top_k, top_p) -> None:
    try:
        SampleConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ConfigError as err:
        raise ValueError("; ".join(f"{name} {text}" for name, text in err.problems)) from None


# Above this temperature the logits are divided as transformers divides them (the same tokens under one seed):
# their quotient would pass float32's range only for logits beyond 1e34.
TINY_TEMPERATURE = 1e-4
# called for every sampled token: the config check costs ~0.1 ms, a lookup nothing
_check_remembered = functools.lru_cache(maxsize=64, typed=True)(_check)  # typed: True == 1, 3.0 == 3


def sample_next_token(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of ``logits`` ``[B, V]``.

    ``temperature == 0`` is greedy decoding (argmax). Otherwise logits are divided by the temperature,
    restricted to the ``top_k`` most likely tokens (if given and not 0) and then to the smallest set whose
    probability reaches ``top_p`` (nucleus sampling, as the paper samples), and one token is drawn.
    Settings are checked by :func:`check_sampling`.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    if temperature < TINY_TEMPERATURE:
        # Logits divided by so small a temperature could pass float32's largest number (a logit of 34 at 1e-37):
        # less their maximum they are <= 0, and the softmax, which subtracts that maximum anyway, is unchanged.
        logits = logits - logits.amax(dim=-1, keepdim=True)
    logits = logits / max(temperature, torch.finfo(torch.float32).tiny)  # a float32 0 would make 0 / 0
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first is always kept).
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
