"""The code of a Transformer-VQ model directory, for ``transformers``' ``trust_remote_code=True``: the classes of the
installed ``transformer-vq`` library, under this file's name. The library never imports this module.

``save_pretrained`` (and so ``tvq export --format hf``) copies this file into the directory as
``modeling_transformer_vq.py`` and names its classes in ``config.json``'s ``auto_map``
(``transformer_vq.hf.modeling.AUTO_MAP``), so that ``AutoConfig``,
``AutoModel`` and ``AutoModelForCausalLM`` load the directory in a process that never imported ``transformer_vq``
(lm-eval, a training script). Nothing is computed here: the classes below add nothing to the library's, so the
directory holds no copy of the model's code and runs whatever ``transformer-vq`` release is installed.

They are subclasses, not the library's classes themselves, because ``save_pretrained`` of a class marked for an auto
class copies the file that defines it into the new directory: marked here, that file is this one, so a model loaded
this way and saved again (``Trainer.save_model``) writes a directory that loads the same way. ``transformer_vq.hf``
registers its own classes with the auto classes; in a process that had not imported it before this file, the last
lines put these in their place, so every later load in the process gives them too. A process that had imported it
keeps its registrations (transformers 5.0 runs this file even then, when asked to trust remote code; 5.24 does not).
"""

import sys

FIRST_IMPORT = "transformer_vq.hf.modeling" not in sys.modules  # this file brings the library into the process

try:  # transformers' check of this file's imports skips try blocks: a missing library gets the message below
    from transformer_vq.hf.configuration import MODEL_TYPE, TransformerVQHFConfig as LibraryConfig
    from transformer_vq.hf.modeling import TransformerVQForCausalLM as LibraryModel
except ImportError as err:
    raise ImportError(f"this model directory runs on the transformer-vq library, which could not be imported "
                      f"({err}): install it with its extra hf (pip install -e '.[hf]' in a checkout of it)") from err

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM


class TransformerVQHFConfig(LibraryConfig):
    """``transformer_vq.hf.TransformerVQHFConfig``."""


class TransformerVQForCausalLM(LibraryModel):
    """``transformer_vq.hf.TransformerVQForCausalLM``."""

    config_class = TransformerVQHFConfig


if FIRST_IMPORT:
    AutoConfig.register(MODEL_TYPE, TransformerVQHFConfig, exist_ok=True)
    for auto in (AutoModel, AutoModelForCausalLM):
        auto.register(TransformerVQHFConfig, TransformerVQForCausalLM, exist_ok=True)
TransformerVQHFConfig.register_for_auto_class("AutoConfig")
TransformerVQForCausalLM.register_for_auto_class("AutoModelForCausalLM")
