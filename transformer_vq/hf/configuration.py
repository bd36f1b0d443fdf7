"""The ``transformers`` configuration of a Transformer-VQ model: every field of :class:`TransformerVQConfig`,
read from and written to ``config.json`` (model_type ``transformer_vq``)."""

from __future__ import annotations

import dataclasses

from transformers import PreTrainedConfig

from transformer_vq.config import TransformerVQConfig

MODEL_TYPE = "transformer_vq"
MODEL_FIELDS = tuple(dataclasses.fields(TransformerVQConfig))


class TransformerVQHFConfig(PreTrainedConfig):
    """:class:`TransformerVQConfig` as a ``transformers`` config.

    Its fields are the library config's fields with the same names and defaults (taken from the dataclass, so the
    two never drift apart); :meth:`model_config` gives the validated library config back. ``config.json`` holds
    every field, defaults included, so a saved model means the same thing whatever later versions change.
    """

    model_type = MODEL_TYPE
    # The library's tied head is a scaled product with the embedding, not a shared parameter for transformers to tie.
    tie_word_embeddings: bool = False
    use_cache: bool = True
    """Return the decoding state from forward (``generate`` needs it)."""

    # One annotated field per library field: transformers' configs are dataclasses.
    __annotations__ = {**__annotations__, **{f.name: f.type for f in MODEL_FIELDS}}
    vars().update({f.name: f.default for f in MODEL_FIELDS})

    if hasattr(PreTrainedConfig, "__post_init__"):  # later transformers build configs as dataclasses
        def __post_init__(self, **kwargs):
            super().__post_init__(**kwargs)
            self.model_config()  # refuse a bad value now, with the library's message, rather than at model building
    else:  # transformers 5.0: a plain __init__ that sets every keyword as an attribute
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.model_config()

    def model_config(self) -> TransformerVQConfig:
        """The library's config of these fields (validated)."""
        return TransformerVQConfig(**{f.name: getattr(self, f.name) for f in MODEL_FIELDS})

    @classmethod
    def from_model_config(cls, cfg: TransformerVQConfig, **kwargs) -> "TransformerVQHFConfig":
        """The ``transformers`` config of a library config (``kwargs``: other ``transformers`` settings)."""
        return cls(**cfg.to_dict(), **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedConfig.save_pretrained``, refusing an invalid field (say ``config.d_model = 33`` after
        construction) before anything is written: ``transformers`` finds it only in :meth:`to_json_file`."""
        self.model_config()
        return super().save_pretrained(save_directory, *args, **kwargs)

    def to_json_file(self, json_file_path, *args, **kwargs):
        """``PreTrainedConfig.to_json_file``, validating first: it opens the file before serializing, so a field
        refused there left an existing ``config.json`` empty."""
        self.model_config()
        return super().to_json_file(json_file_path, *args, **kwargs)

    def to_diff_dict(self) -> dict:
        """What ``config.json`` holds: ``transformers``' differences from the defaults, plus every model field."""
        return {**super().to_diff_dict(), **self.model_config().to_dict()}
