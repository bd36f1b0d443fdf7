"""LongVQ (Liu et al., IJCAI 2024), docs/longvq.md: the SSM module (:mod:`.ssm`, math in
:mod:`transformer_vq.ops.ema`), the layer and block (:mod:`.layer`), the classifier and the language model
(:mod:`.model`)."""

from transformer_vq.models.longvq.layer import LongVQBlock
from transformer_vq.models.longvq.model import LongVQClassifier, LongVQLM

__all__ = ["LongVQBlock", "LongVQClassifier", "LongVQLM"]
