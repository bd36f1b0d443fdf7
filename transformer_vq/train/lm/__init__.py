"""The language-model wing: training on a corpus (``trainer.py``, on the shared engine), evaluation in bits per byte
(``evaluate.py``), sampling (``sample.py``), the recall probe (``recall.py``), and what these build from a config or
a checkpoint (``build.py``)."""

from transformer_vq.train.lm.build import model_from_checkpoint
from transformer_vq.train.lm.evaluate import EvalResult, evaluate, evaluate_tokens
from transformer_vq.train.lm.sample import sample, stream_text
from transformer_vq.train.lm.trainer import LMTrainer, TrainResult, train

__all__ = ["EvalResult", "LMTrainer", "TrainResult", "evaluate", "evaluate_tokens", "model_from_checkpoint", "sample",
           "stream_text", "train"]
