"""The sequence-classification wing: training (``trainer.py``, on the shared engine), evaluation with per-class
accuracy and a confusion matrix (``evaluate.py``), and what these build from a config or a checkpoint
(``build.py``). docs/longvq.md, "Classification"."""

from transformer_vq.train.classify.build import classifier_from_checkpoint
from transformer_vq.train.classify.evaluate import ClassifyEvalResult, classify_eval
from transformer_vq.train.classify.trainer import ClassifyResult, ClassifyTrainer, classify_train

__all__ = ["ClassifyEvalResult", "ClassifyResult", "ClassifyTrainer", "classifier_from_checkpoint", "classify_eval",
           "classify_train"]
