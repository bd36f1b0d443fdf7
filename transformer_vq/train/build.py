"""Building what a job needs from configs and checkpoints: the device, the corpus, the text codec,
and a model rebuilt from a checkpoint alone (its saved config says which architecture)."""

from __future__ import annotations

import torch

from transformer_vq.train.checkpoint import Checkpoint, find_checkpoint
from transformer_vq.train.config import RunConfig, TrainConfig


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available; use --set device=cpu")
    return torch.device(name)


def load_corpus_for(train_cfg: TrainConfig, *, data_path: str | None = None):
    """The corpus a training config names (``data_path`` overrides the configured path)."""
    from transformer_vq.data import load_corpus

    path = data_path if data_path is not None else train_cfg.data_path
    return load_corpus(train_cfg.data, data_path=path)


def codec_for(run_cfg: RunConfig, *, data_path: str | None = None):
    """``(encode, decode)`` for a run: byte-level UTF-8 for 256-token models (no corpus needed),
    otherwise the corpus's own tokenizer."""
    if run_cfg.model.vocab_size == 256:
        def encode(text: str) -> list[int]:
            return list(text.encode("utf-8"))

        def decode(ids) -> str:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

        return encode, decode
    corpus = load_corpus_for(run_cfg.train, data_path=data_path)
    return corpus.encode, corpus.decode


def build_model(run_cfg: RunConfig) -> torch.nn.Module:
    from transformer_vq import TransformerVQ

    return TransformerVQ(run_cfg.model)


def model_from_checkpoint(path: str, *, device: str = "auto") -> tuple[torch.nn.Module, RunConfig, Checkpoint]:
    """The model of a checkpoint (run directory or checkpoint directory) with its weights, in eval
    mode on ``device``, plus its run config and the checkpoint itself."""
    ckpt = find_checkpoint(path)
    run_cfg = RunConfig.from_dict(ckpt.config)
    model = build_model(run_cfg)
    ckpt.load_weights(model)
    model.to(resolve_device(device)).eval()
    return model, run_cfg, ckpt
