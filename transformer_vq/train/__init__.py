"""Training, evaluation and sampling: the library behind ``tvq train``, ``tvq eval`` and ``tvq sample``; sequence
classification (``classify_train``, ``classify_eval``) behind ``tvq classify``.

Layout: one task-free engine (``trainer.py``: the run loop, the guarded step, stopping, save and resume, with
``guard``, ``optim``, ``metrics``, ``signals``, ``rng``), two task wings on it (``lm/``, ``classify/``),
checkpoints and run directories (``checkpoint/``) and data parallelism (``parallel/``).

    from transformer_vq.train import RunConfig, load_config, train, evaluate, sample

    cfg = load_config(preset="small", values={"train": {"steps": 100}})
    result = train(cfg)                                   # -> TrainResult
    print(evaluate("runs/default").bits_per_byte)         # -> EvalResult (or evaluate(EvalConfig(...)))
    print("".join(sample("runs/default", "ROMEO:", max_new_tokens=200, seed=0)))  # or sample(SampleConfig(...))
"""

from transformer_vq.config import ConfigError, EvalConfig, RunConfig, SampleConfig, TrainConfig, load_config
from transformer_vq.train.checkpoint import CheckpointError
from transformer_vq.train.classify import ClassifyEvalResult, ClassifyResult, classify_eval, classify_train
from transformer_vq.train.guard import TrainingError
from transformer_vq.train.lm import EvalResult, TrainResult, evaluate, evaluate_tokens, sample, stream_text, train

__all__ = [
    "CheckpointError",
    "ClassifyEvalResult",
    "ClassifyResult",
    "ConfigError",
    "EvalConfig",
    "EvalResult",
    "RunConfig",
    "SampleConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "classify_eval",
    "classify_train",
    "evaluate",
    "evaluate_tokens",
    "load_config",
    "sample",
    "stream_text",
    "train",
]
