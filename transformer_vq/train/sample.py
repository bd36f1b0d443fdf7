"""Sampling: stream text from a model token by token through its linear-time state.

``model.stream`` carries the operator state, so each new token costs the same whatever the length
of the past (no recomputation). Given the same seed, prompt and settings, the text is the same.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

REPLACEMENT = "\ufffd"


class TextStream:
    """Turns a growing list of token ids into text pieces as soon as they are final.

    A byte-level model emits UTF-8 one byte at a time, so the decoded text may end in an incomplete
    character (shown as U+FFFD); that tail is held back until later tokens complete it.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, token: int) -> str:
        """Add one token; return the new text that is now final (possibly empty)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        stable = len(text.rstrip(REPLACEMENT))
        piece = text[self.emitted:stable] if stable > self.emitted else ""
        self.emitted += len(piece)
        return piece

    def flush(self) -> str:
        """Whatever text is left (an incomplete character comes out as U+FFFD)."""
        text = self.decode(self.ids)
        piece = text[self.emitted:]
        self.emitted = len(text)
        return piece


def stream_text(model: torch.nn.Module, prompt_ids: Sequence[int], decode: Callable[[Sequence[int]], str], *,
                max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                seed: int = 0) -> Iterator[str]:
    """Yield the text of ``max_new_tokens`` sampled tokens piece by piece (the prompt is not repeated)."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty; give at least one character, e.g. --prompt $'\\n'")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, T_prompt)
    was_training = model.training
    model.eval()
    text = TextStream(decode)
    try:
        with torch.no_grad():
            for token in model.stream(input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, generator=generator):
                piece = text.push(int(token[0]))
                if piece:
                    yield piece
    finally:
        model.train(was_training)
    tail = text.flush()
    if tail:
        yield tail


def sample(ckpt: str, prompt: str = "\n", *, max_new_tokens: int = 500, temperature: float = 1.0,
           top_k: int | None = None, top_p: float = 1.0, seed: int = 0, data_path: str | None = None,
           device: str = "auto") -> Iterator[str]:
    """Stream text sampled from a checkpoint (a run directory or a checkpoint directory).

    Returns an iterator of text pieces; ``"".join(sample(...))`` is the whole sample.
    """
    from transformer_vq.train.build import codec_for, model_from_checkpoint

    model, run_cfg, _ = model_from_checkpoint(ckpt, device=device)
    encode, decode = codec_for(run_cfg, data_path=data_path)
    prompt_ids = encode(prompt)
    bad = [i for i in prompt_ids if not 0 <= i < run_cfg.model.vocab_size]
    if bad:
        raise ValueError(f"the prompt encodes to token id {bad[0]}, outside the model's vocabulary "
                         f"[0, {run_cfg.model.vocab_size})")
    return stream_text(model, prompt_ids, decode, max_new_tokens=max_new_tokens, temperature=temperature,
                       top_k=top_k, top_p=top_p, seed=seed)
