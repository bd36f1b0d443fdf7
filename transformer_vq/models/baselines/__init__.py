"""The classifiers LongVQ is compared with (docs/longvq.md, "Classifiers"): a quadratic Transformer encoder and
Transformer-VQ as an encoder, built from the same :class:`~transformer_vq.config.LongVQConfig`."""

from transformer_vq.models.baselines.classifiers import TransformerClassifier, TransformerVQEncoderClassifier

__all__ = ["TransformerClassifier", "TransformerVQEncoderClassifier"]
