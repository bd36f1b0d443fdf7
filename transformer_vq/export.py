"""Converting a training run's model into a directory other tools load (``tvq export``): a Hugging Face
``transformers`` model directory, or one consolidated ``model.safetensors`` beside the library's ``config.json``.

Both hold the model's weights and its persistent buffers (the EMA codebooks) and nothing of training (no optimizer
state, no RNG). The run is read through ``transformer_vq.train.lm.model_from_checkpoint``, whatever layout its
checkpoints have; the directory is written atomically (complete or absent).

The ``safetensors`` format needs nothing beyond the core install. The ``transformers`` directory is written by
:func:`transformer_vq.hf.export.save_hf` (the ``hf`` extra), imported only when that format is asked for.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from transformer_vq.config import ConfigError
from transformer_vq.config.jobs import ExportConfig
from transformer_vq.config.reading import check_safetensors, read_json

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def export(cfg: ExportConfig) -> Path:
    """Write the model of run ``cfg.ckpt`` to ``cfg.out`` in ``cfg.format``; returns the directory written."""
    out = Path(cfg.out)
    check_out(out)
    if cfg.format == "hf" and importlib.util.find_spec("transformers") is None:
        raise ConfigError("--format hf needs transformers: install the extra hf (pip install -e '.[hf]' in the "
                          "checkout, or pip install 'transformers>=5.0,<6')")
    from transformer_vq.fileio import atomic_directory
    from transformer_vq.train.lm.build import model_from_checkpoint

    # eager whatever the run trained with: the same attention, and a directory that runs on any machine (the
    # backend is an execution choice; set attn_backend in its config.json to use the fused kernels on a GPU)
    model, run_cfg, checkpoint = model_from_checkpoint(cfg.ckpt, device="cpu", command="export", attn_backend="eager")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out) as tmp:
        if cfg.format == "hf":
            from transformer_vq.hf.export import save_hf

            save_hf(model, tmp, run_sentencepiece_model(run_cfg, checkpoint))
        else:
            save_safetensors(model, tmp)
    return out


def check_out(out: Path) -> None:
    """Refuse an output path that is a file or a directory with something in it (nothing is ever overwritten)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "a directory that is not empty"
        raise ConfigError(f"--out: {out} is {what}; pass a new or empty directory")


def run_sentencepiece_model(run_cfg, checkpoint) -> Path | None:
    """The SentencePiece model of a run: the run's copy (``tokenizer.model`` in the run directory, written when the
    run started) or the file its ``tokenizer=`` data option names; None when it has neither (byte-level runs)."""
    from transformer_vq.train.checkpoint import run_dir_of
    from transformer_vq.train.lm.build import RUN_TOKENIZER

    for path in (run_dir_of(checkpoint) / RUN_TOKENIZER, run_cfg.train.data_options.get("tokenizer")):
        if path and Path(path).is_file():
            return Path(path)
    return None


def save_safetensors(model, directory: Path) -> None:
    """``model.safetensors`` (the state dict: weights and persistent buffers) and ``config.json`` (the library's
    :class:`~transformer_vq.config.TransformerVQConfig`) in ``directory``."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")


def load_safetensors(directory: str | Path):
    """The :class:`~transformer_vq.TransformerVQ` of a directory written by ``tvq export --format safetensors``
    (eval mode, on the CPU)."""
    from safetensors.torch import load_file

    from transformer_vq import TransformerVQ, TransformerVQConfig

    directory = Path(directory)
    hint = "pass a directory written by tvq export --format safetensors, or export the run again"
    config = read_json(directory / CONFIG_FILE, "the model config of an export (JSON)", hint)
    model = TransformerVQ(TransformerVQConfig.from_dict(config))
    weights = check_safetensors(directory / WEIGHTS_FILE, "model weights in safetensors format", hint)
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    if missing or unexpected:  # loaded whole or not at all, every offending name listed
        raise ValueError(f"{directory / WEIGHTS_FILE} does not hold this model's tensors (missing: "
                         f"{', '.join(missing) or 'none'}; unexpected: {', '.join(unexpected) or 'none'}); it was "
                         f"saved from another model or damaged: export the run again")
    return model.eval()
