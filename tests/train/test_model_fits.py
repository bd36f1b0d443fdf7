"""A model too large for the machine is refused before anything is allocated, naming the config field that sizes its
largest tensor (an allocation would fail with an out-of-memory error naming no field, or take the machine down)."""

from __future__ import annotations

import pytest

import transformer_vq.train.models as models
from transformer_vq.cli import main
from transformer_vq.config import ConfigError
from transformer_vq.config.arch import ARCHS, find_arch


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"{a.task}-{a.name}")
def test_the_count_on_the_meta_device_is_the_built_model(arch):
    cfg = arch.presets["tiny"]
    if arch.task == "classify":
        cfg = cfg.replace(n_classes=3, causal=False)
    built = models.model_class(arch)(cfg)
    tensors = [*built.parameters(), *built.buffers()]
    total, name, shape = models.model_bytes(arch, cfg)
    assert total == sum(t.numel() * t.element_size() for t in tensors)
    assert shape == tuple(dict([*built.named_parameters(), *built.named_buffers()])[name].shape)


def test_a_codebook_too_large_is_refused_naming_n_code():
    arch = find_arch("lm", "tvq")
    cfg = arch.presets["tiny"].replace(n_code=2**20)  # 16 x 2**20 floats per codebook: 64 MiB each, and its stats
    total = models.model_bytes(arch, cfg)[0]
    assert 4 * 2 * 16 * 2**20 < total < 2**30
    with pytest.raises(ConfigError) as caught:
        models.check_fits(arch, cfg, available=total - 1)
    text = (f"1048576 makes a model of {total / 2**30:.1f} GiB of weights and buffers (units.0.quantizer.ema_sum "
            f"alone is 1 x 1048576 x 16), more than the {(total - 1) / 2**30:.1f} GiB of memory available; lower it "
            f"(or another size of the model)")
    assert caught.value.problems == (("n_code", text),)
    models.check_fits(arch, cfg, available=total)


def test_tvq_train_says_which_flag_to_lower(capsys, monkeypatch):
    monkeypatch.setattr(models, "meminfo_bytes", lambda key: 4 * 2**30)
    arch = find_arch("lm", "tvq")
    total = models.model_bytes(arch, arch.presets["tiny"].replace(n_code=10**9))[0]
    assert main(["train", "--preset", "tiny", "--n-code", "1000000000", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --n-code: 1000000000 makes a model of {total / 2**30:,.1f} GiB of weights and buffers "
        f"(units.0.quantizer.ema_sum alone is 1 x 1000000000 x 16), more than the 4.0 GiB of memory available; lower "
        f"it (or another size of the model)")
