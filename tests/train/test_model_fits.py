"""A model too large for the machine is refused before anything is allocated, naming the config field that sizes its
largest tensor (an allocation would fail with an out-of-memory error naming no field, or take the machine down)."""

from __future__ import annotations

import pytest
import torch

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


def _tiny_lm():
    arch = find_arch("lm", "tvq")
    return lambda: models.model_class(arch)(arch.presets["tiny"])


def test_a_training_holds_weights_gradients_and_the_optimizer_s_moments():
    """Counted on the meta device, without drawing a random number (the seed that follows makes the weights)."""
    from transformer_vq.train.fits import state_bytes

    built = _tiny_lm()()
    weights = sum(p.numel() * p.element_size() for p in built.parameters())
    buffers = sum(b.numel() * b.element_size() for b in built.buffers())
    before = torch.random.get_rng_state()
    assert state_bytes(_tiny_lm(), "adamw") == (sum(p.numel() for p in built.parameters()), 4 * weights + buffers)
    assert state_bytes(_tiny_lm(), "adafactor")[1] == 2 * weights + buffers
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_model_whose_weights_fit_but_whose_training_does_not_is_refused_before_it_is_built(capsys, monkeypatch,
                                                                                          tmp_path):
    """The weights-only check passed a 5.7B-parameter model on a 24 GiB machine (21 GiB of weights); the OOM killer
    then ended the training at its first step, without a word."""
    import transformer_vq.train.fits as fits

    need = fits.state_bytes(_tiny_lm(), "adamw")[1]
    monkeypatch.setattr(fits, "meminfo_bytes", lambda key: {"MemAvailable": need // 2, "SwapFree": 0}[key])
    run_dir = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--steps", "1", "--run-dir", str(run_dir)]) == 2
    line = capsys.readouterr().err.strip()
    params = fits.state_bytes(_tiny_lm(), "adamw")[0]
    assert line == (f"error: the model does not fit: its {params / 1e6:,.1f}M parameters with their gradients and "
                    f"AdamW's state need {need / 2**30:,.1f} GiB before any activation, and this machine has "
                    f"{need // 2 / 2**30:,.1f} GiB available; make it smaller (--d-model, --n-layers, --vocab-size) "
                    f"or shard it over more workers (torchrun with --parallel fsdp)")
    assert not run_dir.exists()


def test_fsdp_workers_share_the_state_and_the_workers_of_a_host_share_its_memory(monkeypatch):
    import transformer_vq.train.fits as fits

    need = fits.state_bytes(_tiny_lm(), "adamw")[1]
    cpu = torch.device("cpu")
    monkeypatch.setattr(fits, "available_bytes", lambda device: need // 2 + 1)
    fits.check_fits(_tiny_lm(), "adamw", cpu, world_size=2, fsdp=True)  # half each
    with pytest.raises(ConfigError, match=r"\(a 1/2 FSDP shard\) on each of 2 workers"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # both on this host
        fits.check_fits(_tiny_lm(), "adamw", cpu, world_size=2, fsdp=True)
    with pytest.raises(ConfigError, match=r"available; make it smaller \(--d-model, --n-layers\)$"):
        monkeypatch.delenv("LOCAL_WORLD_SIZE")
        fits.check_fits(_tiny_lm(), "adamw", cpu, task="classify")  # one process, the dataset's vocabulary
