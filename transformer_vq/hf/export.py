"""The ``transformers`` directory of a library model (``tvq export --format hf``; :mod:`transformer_vq.export` reads
the run and writes the directory atomically).

The directory is self-contained: beside the weights it holds the run's tokenizer (:mod:`transformer_vq.hf.tokenizer`,
loaded by ``AutoTokenizer`` with no remote code) and the remote code (``transformer_vq/hf/remote_code.py``, named by
``config.json``'s ``auto_map``, written by every ``save_pretrained``), so ``AutoModelForCausalLM`` loads it with
``trust_remote_code=True`` in a process that never imported ``transformer_vq``.
"""

from __future__ import annotations

from pathlib import Path

from transformer_vq.hf.modeling import TransformerVQForCausalLM
from transformer_vq.hf.tokenizer import write_run_tokenizer


def save_hf(model, directory: Path, sentencepiece_model: Path | None = None) -> None:
    """The ``transformers`` directory of ``model``: ``config.json`` (with ``auto_map``), ``model.safetensors``,
    ``generation_config.json``, the remote code and the tokenizer (bytes, or translated from
    ``sentencepiece_model``)."""
    write_run_tokenizer(directory, model.cfg.vocab_size, sentencepiece_model)  # first: it may refuse the run
    TransformerVQForCausalLM.from_library_model(model).save_pretrained(directory)  # auto_map and remote code too
