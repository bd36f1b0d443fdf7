"""Every configuration of the library, torch-free: the models (:class:`TransformerVQConfig` and the paper's
presets; :class:`LongVQConfig` and its presets; the registry of architectures, :data:`ARCHS`), training
(:class:`TrainConfig`, :class:`RunConfig`), evaluation and sampling (:class:`EvalConfig`, :class:`SampleConfig`),
the other jobs (:class:`ExportConfig`, :class:`TokenizerConfig`), sequence classification (:class:`ClassifyConfig`),
and the enumerations they choose from. Each field carries its help text and rules (``transformer_vq.config.fields``);
``transformer_vq.config.flags`` turns the fields into command-line flags."""

from transformer_vq.config.arch import ARCHS, CLASSIFY_ARCHS, LM_ARCHS, LM_PRESETS, Arch, find_arch
from transformer_vq.config.choices import (ATTN_BACKENDS, ATTN_TYPES, DEVICES, HEAD_TYPES, OP_METHODS, OPTIMIZERS,
                                           PRECISIONS, REDUCTIONS)
from transformer_vq.config.classify import ClassifyConfig, ClassifyEvalConfig, ClassifyTrainConfig, classify_config
from transformer_vq.config.fields import ConfigError
from transformer_vq.config.jobs import EvalConfig, ExportConfig, SampleConfig, TokenizerConfig
from transformer_vq.config.longvq import CLASSIFY_PRESETS, LONGVQ_PRESETS, NORMS, LongVQConfig, longvq_preset
from transformer_vq.config.load import load_config, parse_data_options, read_run_config
from transformer_vq.config.model import PRESETS, TRAINING_ONLY_FIELDS, TransformerVQConfig, preset
from transformer_vq.config.train import PAPER_LR, RunConfig, TrainConfig, check_compatible

__all__ = [
    "ARCHS", "ATTN_BACKENDS", "ATTN_TYPES", "Arch", "CLASSIFY_ARCHS", "LM_ARCHS", "LM_PRESETS", "CLASSIFY_PRESETS",
    "ClassifyConfig", "ClassifyEvalConfig", "ClassifyTrainConfig", "classify_config", "find_arch", "DEVICES",
    "HEAD_TYPES", "LONGVQ_PRESETS", "LongVQConfig", "NORMS", "longvq_preset",
    "OPTIMIZERS", "OP_METHODS", "PAPER_LR", "PRECISIONS", "PRESETS",
    "REDUCTIONS", "TRAINING_ONLY_FIELDS", "ConfigError", "EvalConfig", "ExportConfig", "RunConfig", "SampleConfig",
    "TokenizerConfig", "TrainConfig",
    "TransformerVQConfig", "check_compatible", "load_config", "parse_data_options", "preset", "read_run_config",
]
