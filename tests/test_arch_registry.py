"""The registry of architectures (`transformer_vq.config.arch.ARCHS`): every entry builds its model from its config
class, a saved run config names its entry, and the commands that serve some architectures only refuse the others by
what the registry says."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.ablate.codebook import codebook_report
from transformer_vq.config import ClassifyConfig, ClassifyTrainConfig, ConfigError, classify_config, load_config
from transformer_vq.config.arch import ARCHS, CLASSIFY_ARCHS, LM_ARCHS, find_arch, run_arch
from transformer_vq.train.checkpoint import save_checkpoint
from transformer_vq.train.models import instantiate


def tiny_config(arch):
    """The ``tiny`` preset of ``arch``, a classifier's with classes."""
    cfg = arch.presets["tiny"]
    return cfg.replace(n_classes=3, causal=False) if arch.task == "classify" else cfg


def test_each_task_names_each_architecture_once():
    assert LM_ARCHS == ("tvq", "longvq") and CLASSIFY_ARCHS == ("longvq", "transformer", "tvq")
    assert len({(a.task, a.name) for a in ARCHS}) == len(ARCHS)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"{a.task}-{a.name}")
def test_every_registered_model_builds_from_its_config_class(arch):
    model = instantiate(arch, tiny_config(arch))
    assert type(model).__name__ == arch.model.rpartition(":")[2]
    assert all(type(preset) is arch.config for preset in arch.presets.values())
    model.codebook_metrics()  # the codebook interface the training engine calls


def test_a_config_of_another_class_is_refused():
    with pytest.raises(TypeError) as err:
        instantiate(find_arch("lm", "tvq"), find_arch("lm", "longvq").presets["tiny"])
    assert str(err.value) == "a Transformer-VQ language model is built from a TransformerVQConfig, got LongVQConfig"


def test_a_saved_run_config_names_its_architecture():
    assert run_arch(load_config("tiny", arch="longvq").to_dict()) is find_arch("lm", "longvq")
    saved = load_config("tiny").to_dict()
    del saved["arch"]  # written before LongVQ existed
    assert run_arch(saved) is find_arch("lm", "tvq")
    classifier = ClassifyConfig(model=tiny_config(find_arch("classify", "tvq")),
                                train=ClassifyTrainConfig(arch="transformer"))
    assert run_arch(classifier.to_dict()) is find_arch("classify", "transformer")
    with pytest.raises(ConfigError) as err:
        find_arch("classify", "mamba")
    assert str(err.value) == "unknown architecture 'mamba'; available: longvq, transformer, tvq"


def test_tvq_codebook_reads_every_model_with_vq_layers(tmp_path):
    cfg = load_config("tiny", arch="longvq")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "checkpoints", step=1, model=instantiate(find_arch("lm", "longvq"), cfg.model),
                    config=cfg.to_dict(), state={}, keep=1)
    units = codebook_report(tmp_path)["units"]
    assert [(u["unit"], u["kind"], u["group"], u["codes"]) for u in units] == [(0, "key", 0, 8), (1, "key", 0, 8)]


def test_tvq_codebook_refuses_an_architecture_it_does_not_serve(tmp_path):
    cfg = classify_config(n_classes=3, vocab_size=10, preset="tiny", train={"arch": "transformer"})
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "checkpoints", step=1,
                           model=instantiate(find_arch("classify", "transformer"), cfg.model),
                           config=cfg.to_dict(), state={}, keep=1)
    with pytest.raises(ConfigError) as err:
        codebook_report(tmp_path)
    assert str(err.value) == (
        f"--ckpt: {path} holds a full-attention Transformer classifier (baseline) (a run of tvq classify train --arch "
        f"transformer), and tvq codebook reads a Transformer-VQ language model (tvq train --arch tvq) or a LongVQ "
        f"causal language model (SSM and gated VQ attention) (tvq train --arch longvq) or a LongVQ classifier (tvq "
        f"classify train --arch longvq) or a Transformer-VQ encoder classifier (baseline) (tvq classify train --arch "
        f"tvq); for this run use tvq classify eval")
