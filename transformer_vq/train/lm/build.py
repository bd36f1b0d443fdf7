"""What a language-model job builds from its config or a checkpoint: the corpus, the text codec, and a model rebuilt
from a checkpoint alone (its saved config says which architecture)."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import torch

from transformer_vq.config import RunConfig, TrainConfig
from transformer_vq.config.arch import check_serves, find_arch
from transformer_vq.data.codec import BYTE_VOCAB, decode_bytes, encode_bytes
from transformer_vq.data.errors import DataError
from transformer_vq.train.checkpoint.resume import other_data
from transformer_vq.train.checkpoint.store import Checkpoint, find_checkpoint, run_dir_of
from transformer_vq.train.device import resolve_device, runnable_on
from transformer_vq.train.models import instantiate

# A run's copy of its corpus's tokenizer (PG-19's SentencePiece model), so the run can be evaluated
# and sampled from wherever the original tokenizer went.
RUN_TOKENIZER = "tokenizer.model"


def load_corpus_for(train_cfg: TrainConfig, *, data_path: str | None = None, run_dir: str | Path | None = None,
                    data_options: dict | None = None):
    """The corpus a training config names, with its saved loader options.

    ``data_path`` overrides the configured path; with ``run_dir``, the run's own copy of the
    tokenizer (if it has one) is used; ``data_options`` override the saved options (and that copy).
    A loader that takes ``seq_len`` (a corpus of fixed-length sequences, like the recall probe) gets
    the run's, so its sequences and the training sequences always coincide.
    """
    from transformer_vq.data import load_corpus

    path = data_path if data_path is not None else train_cfg.data_path
    options = corpus_options(train_cfg)
    own = Path(run_dir) / RUN_TOKENIZER if run_dir is not None else None
    if own is not None and own.is_file():
        options["tokenizer"] = str(own)
        refuse_another_tokenizer(own, (data_options or {}).get("tokenizer"))
    options.update(data_options or {})
    return load_corpus(train_cfg.data, data_path=path, **options)


def other_corpus_note(ckpt: Checkpoint, corpus, data_path, data_options: dict | None = None) -> str | None:
    """A note when ``data_path`` holds another corpus than the one the checkpoint recorded (:func:`other_data`: the
    same corpus moved elsewhere is not another), else None. Not refused: scoring a language model on other text (a
    held-out file, lm-eval's documents) is a use of ``tvq eval``, but it must not pass for the run's own figure.
    None without ``data_path`` (the run's own), for a checkpoint of before the record was saved, and with
    ``data_options`` overrides (the corpus they make is another by design: other fractions, episodes)."""
    from transformer_vq.data.corpus import corpus_fingerprint

    saved = ckpt.state.get("corpus")
    if data_path is None or saved is None or data_options:
        return None
    different = other_data(saved, {**corpus_fingerprint(corpus), "data_path": data_path}, noun="corpus",
                           unit="tokens")
    return None if different is None else (f"note: scoring on another corpus than the run's: --data-path holds "
                                           f"{different[1]}; the run in {run_dir_of(ckpt)} was trained on "
                                           f"{different[0]}")


def refuse_another_tokenizer(own: Path, given: str | None) -> None:
    """A model scores and samples only in the tokenization it was trained on: a ``tokenizer`` option other than the
    run's copy ``own`` (by content) is refused, since it gave a figure in silence (8.5 bits per byte for 5.1)."""
    if given is None or not Path(given).expanduser().is_file():
        return  # no override, or one the loader reports as missing
    if hashlib.sha256(Path(given).expanduser().read_bytes()).digest() != hashlib.sha256(own.read_bytes()).digest():
        raise DataError(f"--data-option tokenizer={given} is not the tokenizer this run was trained with ({own}): "
                        f"the model's tokens would be read as another tokenizer's; leave the option out")


def corpus_options(train_cfg: TrainConfig) -> dict:
    """The loader options of the corpus a training config names: its ``data_options``, with the run's ``seq_len``
    for a loader that takes one."""
    import inspect

    from transformer_vq.data.registry import loader

    options = dict(train_cfg.data_options)
    if "seq_len" in inspect.signature(loader(train_cfg.data)).parameters:
        options.setdefault("seq_len", train_cfg.seq_len)
    return options


def check_corpus_options(train_cfg: TrainConfig) -> None:
    """Refuse an unknown dataset or a dataset option its declaration refuses (``DataError``), before any work: the
    run directory is not touched and no model is built for a run whose data cannot load."""
    from transformer_vq.data.options import checked_options
    from transformer_vq.data.registry import loader

    checked_options(train_cfg.data, loader(train_cfg.data), corpus_options(train_cfg))


def check_documents_used(train_cfg: TrainConfig) -> None:
    """Refuse (``DataError``) ``lines``, which makes each line a document, without ``pack``: the documents are read
    only by packing, so the run would be the same and the option ignored. After the resume checks, whose refusal of
    a changed option says more to a resumed run."""
    if train_cfg.data_options.get("lines") and not train_cfg.pack:
        raise DataError("--data-option lines: one document per line separates packed documents; it applies only "
                        "with --pack: add --pack or leave it out")


def save_run_tokenizer(corpus, run_dir: str | Path) -> Path | None:
    """Copy the corpus's tokenizer file (``metadata["tokenizer"]``, PG-19) into the run directory,
    where :func:`load_corpus_for` finds it; returns the copy, or None for corpora without one."""
    source = corpus.metadata.get("tokenizer")
    if not source:
        return None
    target = Path(run_dir) / RUN_TOKENIZER
    if not (target.exists() and target.samefile(source)):
        shutil.copyfile(source, target)
    return target


def codec_for(run_cfg: RunConfig, *, data_path: str | None = None, run_dir: str | Path | None = None):
    """``(encode, decode)`` for a run: byte-level UTF-8 for 256-token models (no corpus needed),
    otherwise the corpus's own tokenizer (the run's copy when ``run_dir`` has one)."""
    if run_cfg.model.vocab_size == BYTE_VOCAB:
        if data_path is not None:  # a flag that would change nothing is refused rather than silently ignored
            raise DataError(f"--data-path: this model reads bytes (vocab_size {BYTE_VOCAB}) and needs no corpus to "
                            f"encode or decode text; leave --data-path out")
        return encode_bytes, decode_bytes
    corpus = load_corpus_for(run_cfg.train, data_path=data_path, run_dir=run_dir)
    return corpus.encode, corpus.decode


def build_model(run_cfg: RunConfig) -> torch.nn.Module:
    """The language model of a run's architecture (the registry's, :mod:`transformer_vq.config.arch`):
    :class:`~transformer_vq.TransformerVQ` or :class:`~transformer_vq.models.longvq.model.LongVQLM` (same call, state
    and codebook interface)."""
    return instantiate(find_arch("lm", run_cfg.arch), run_cfg.model)


def model_from_checkpoint(path: str, *, device: str = "auto", command: str = "eval",
                          attn_backend: str | None = None) -> tuple[torch.nn.Module, RunConfig, Checkpoint]:
    """The model of a checkpoint (run directory or checkpoint directory) with its weights, in eval
    mode on ``device``, plus its run config and the checkpoint itself. A run that ``tvq command`` does not read (a
    classifier's, for any of them) is refused, naming its kind and the commands that read it. A run trained with
    ``attn_backend`` 'triton' is read with 'eager' where triton cannot run (the same attention: the backend is how
    training computed it, not what the weights mean); ``attn_backend`` given: read with that one."""
    ckpt = find_checkpoint(path)
    check_serves(ckpt.config, command, ckpt.path)
    where = resolve_device(device)
    run_cfg = runnable_on(RunConfig.from_dict(ckpt.config), where)
    if attn_backend is not None and hasattr(run_cfg.model, "attn_backend"):
        run_cfg = dataclasses.replace(run_cfg, model=run_cfg.model.replace(attn_backend=attn_backend))
    model = build_model(run_cfg)
    ckpt.load_weights(model)
    model.to(where).eval()
    return model, run_cfg, ckpt
