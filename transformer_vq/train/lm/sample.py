"""Sampling: stream text from a model token by token through its linear-time state, or, for an
image model (trained on ``imagenet64``), sample whole 64x64 images and write them as PNG files.

``model.stream`` carries the operator state, so each new token costs the same whatever the length
of the past (no recomputation). Given the same seed, prompt and settings, the text is the same.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from transformer_vq.config import ConfigError, SampleConfig
from transformer_vq.config.arch import refuse_job_options
from transformer_vq.config.choices import IMAGE_CORPORA
from transformer_vq.config.jobs import job_config
from transformer_vq.data.codec import BYTE_VOCAB, decode_bytes
from transformer_vq.data.progress import on_terminal
from transformer_vq.train.checkpoint.store import run_dir_of
from transformer_vq.train.device import use_threads
from transformer_vq.nn.inference import evaluating
from transformer_vq.train.lm.build import codec_for, model_from_checkpoint

REPLACEMENT = "\ufffd"


class TextStream:
    """Turns a growing list of token ids into text pieces as soon as they are final.

    A byte-level model emits UTF-8 one byte at a time, so the decoded text may end in an incomplete
    character (shown as U+FFFD); that tail is held back until later tokens complete it. Bytes are decoded
    incrementally (each token costs the same, as the model's step does); another tokenizer's text is decoded whole
    at each token, its pieces being words whose joins only it knows.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.emitted = 0
        # the same text as decode_bytes of every id so far (errors="replace"), an incomplete character held inside
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace") if decode is decode_bytes else None

    def push(self, token: int) -> str:
        """Add one token; return the new text that is now final (possibly empty)."""
        if self.utf8 is not None:
            return self.utf8.decode(bytes([token]))
        self.ids.append(token)
        text = self.decode(self.ids)
        stable = len(text.rstrip(REPLACEMENT))
        piece = text[self.emitted:stable] if stable > self.emitted else ""
        self.emitted += len(piece)
        return piece

    def flush(self) -> str:
        """Whatever text is left (an incomplete character comes out as U+FFFD)."""
        if self.utf8 is not None:
            return self.utf8.decode(b"", final=True)
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
    text = TextStream(decode)
    with evaluating(model):
        for token in model.stream(input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                  top_p=top_p, generator=generator):
            piece = text.push(int(token[0]))
            if piece:
                yield piece
    tail = text.flush()
    if tail:
        yield tail


def sample(ckpt: str | SampleConfig, prompt: str | None = None, **options) -> Iterator[str]:
    """Stream text sampled from a checkpoint (a run directory or a checkpoint directory).

    ``ckpt`` is a :class:`~transformer_vq.config.SampleConfig`, or a checkpoint path with the other
    SampleConfig fields as keywords (``sample("runs/default", "ROMEO:", max_new_tokens=200, seed=0)``).
    Returns an iterator of the text pieces sampled after the prompt (the prompt itself is not repeated, where
    ``tvq sample`` prints it first); ``"".join(sample(...))`` is the whole continuation.
    """
    cfg = job_config(SampleConfig, ckpt, prompt=prompt, **options)
    model, run_cfg, checkpoint = sampler_from_checkpoint(cfg)
    encode, decode = codec_for(run_cfg, data_path=cfg.data_path, run_dir=run_dir_of(checkpoint))
    try:
        prompt_ids = encode(cfg.prompt)
    except UnicodeEncodeError as err:  # a lone surrogate: no tokenizer of text has an id for it
        text = f"is not text ({err.reason} at character {err.start}: {cfg.prompt[err.start:err.end]!r})"
        raise ConfigError(f"invalid SampleConfig: prompt {text}", [("prompt", text)], SampleConfig) from None
    bad = [i for i in prompt_ids if not 0 <= i < run_cfg.model.vocab_size]
    if bad:
        raise ValueError(f"the prompt encodes to token id {bad[0]}, outside the model's vocabulary "
                         f"[0, {run_cfg.model.vocab_size})")
    return stream_text(model, prompt_ids, decode, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                       top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed)


def sampler_from_checkpoint(cfg: SampleConfig):
    """``(model, run config, checkpoint)`` of the run ``cfg.ckpt`` names, refused unless it can sample: a causal
    language model, with no option of ``cfg`` that its kind of sample ignores (a prompt for an image model)."""
    use_threads(cfg.threads)
    model, run_cfg, checkpoint = model_from_checkpoint(cfg.ckpt, device=cfg.device, command="sample")
    if not run_cfg.model.causal:
        raise ConfigError(f"--ckpt: {cfg.ckpt} holds an encoder (causal false), which predicts masked tokens from "
                          f"both sides and cannot generate; score it with tvq eval --ckpt {cfg.ckpt}")
    refuse_job_options(cfg, run_cfg)
    if cfg.temperature == 0 and cfg.seed != 0 and not is_image_run(run_cfg):
        # greedy text draws nothing; an image's first subpixel is drawn at any temperature (an OR of two
        # conditions, which the options' ``applies`` cannot say)
        text = (f"applies only with temperature above 0, or to an image model (this run has temperature 0.0 and "
                f"data {run_cfg.train.data!r}), got {cfg.seed}; leave it out, or set temperature as it needs")
        raise ConfigError(f"invalid SampleConfig: seed {text}", [("seed", text)], SampleConfig)
    return model, run_cfg, checkpoint


def is_image_run(run_cfg) -> bool:
    """Whether a run's model generates images: decided by the corpus it was trained on (saved config)."""
    return run_cfg.train.data in IMAGE_CORPORA


def sample_image_tokens(model: torch.nn.Module, num_images: int, *, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
                        progress: bool | None = None) -> torch.Tensor:
    """``[num_images, 12288]`` bytes: images sampled side by side as one batch.

    An image's first subpixel is never predicted from its own image in training (a sequence starts
    with it and there is no start token; only the image before, whose sequence's last target it is,
    predicts it), so it is drawn uniformly from 0..255 with the seeded generator; the model samples
    the remaining 12,287 given it. ``progress``: a progress bar over the subpixels
    (default: when stderr is a terminal; on a CPU this takes minutes).
    """
    from transformer_vq.data.imagenet64 import IMAGE_TOKENS

    if num_images < 1:
        raise ValueError(f"the number of images must be at least 1, got {num_images}")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    first = torch.randint(0, BYTE_VOCAB, (num_images, 1), generator=generator, device=device)  # (N, 1)
    tokens = model.stream(first, IMAGE_TOKENS - 1, temperature=temperature, top_k=top_k, top_p=top_p,
                          generator=generator)
    if progress is None:
        progress = on_terminal()
    if progress:
        from tqdm import tqdm

        tokens = tqdm(tokens, total=IMAGE_TOKENS - 1, desc=f"sampling {num_images} images", unit="subpixel",
                      leave=False)
    with evaluating(model):
        rest = list(tokens)
    return torch.cat([first, torch.stack(rest, dim=1)], dim=1).cpu()  # (N, 12288)


def sample_images(ckpt: str | SampleConfig, out_dir: str | os.PathLike | None = None, **options) -> list[Path]:
    """Sample ``num_samples`` images from an image model's checkpoint into ``out_dir`` (default: the
    config's ``out``, else RUN_DIR/samples); ``ckpt`` and ``options`` as in :func:`sample`.

    Writes ``sample_000.png`` ... (one 64x64 RGB PNG per image) and ``grid.png`` (all of them,
    :func:`~transformer_vq.data.images.save_grid`); returns the paths, the grid last.
    """
    from transformer_vq.data.images import save_grid, save_png

    cfg = job_config(SampleConfig, ckpt, out=None if out_dir is None else str(out_dir), **options)
    model, run_cfg, checkpoint = sampler_from_checkpoint(cfg)
    if not is_image_run(run_cfg) or run_cfg.model.vocab_size != BYTE_VOCAB:
        raise ValueError(f"{cfg.ckpt} is not an image model (trained on {run_cfg.train.data!r}, vocabulary "
                         f"{run_cfg.model.vocab_size}); image sampling needs a byte model trained on "
                         f"{' or '.join(IMAGE_CORPORA)}")
    images = sample_image_tokens(model, cfg.num_samples, temperature=cfg.temperature, top_k=cfg.top_k,
                                 top_p=cfg.top_p, seed=cfg.seed).numpy()
    out = Path(cfg.out) if cfg.out is not None else run_dir_of(checkpoint) / "samples"
    paths = [save_png(tokens, out / f"sample_{i:03d}.png") for i, tokens in enumerate(images)]
    paths.append(save_grid(list(images), out / "grid.png"))
    return paths
