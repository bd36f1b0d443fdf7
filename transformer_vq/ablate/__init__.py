"""Experiment matrices (``tvq ablate``): short trainings that differ in one setting, run in isolation, resumable,
reported as JSON, a markdown table and plots (docs/quality.md).

    from transformer_vq.ablate import run_ablation
    from transformer_vq.config.ablate import AblateConfig

    result = run_ablation(AblateConfig(matrix="codebook", steps=300, seeds=(0, 1)))
    print(result["paths"]["md"])

The ``recall`` matrix is the long-range memory probe: its own data and model, and every cell scored by recall
accuracy against distance (``AblateConfig(matrix="recall")`` takes the matrix's defaults).
"""

from transformer_vq.ablate.runner import run_ablation
from transformer_vq.config.ablate import MATRICES, AblateConfig, Matrix

__all__ = ["AblateConfig", "MATRICES", "Matrix", "run_ablation"]
