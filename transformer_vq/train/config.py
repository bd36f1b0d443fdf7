"""The training configs, re-exported from their home ``transformer_vq.config`` (kept so that
``from transformer_vq.train.config import RunConfig`` goes on working)."""

from transformer_vq.config import (DEVICES, OPTIMIZERS, PAPER_LR, PRECISIONS, ConfigError, RunConfig, TrainConfig,
                                   check_compatible, load_config, parse_data_options, read_run_config)

__all__ = ["DEVICES", "OPTIMIZERS", "PAPER_LR", "PRECISIONS", "ConfigError", "RunConfig", "TrainConfig",
           "check_compatible", "load_config", "parse_data_options", "read_run_config"]
