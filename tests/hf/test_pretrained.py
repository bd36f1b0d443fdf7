"""The transformers config and save_pretrained / from_pretrained: every field and every buffer comes back, and the
logits are bitwise the same."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from hfutil import tiny_model  # noqa: E402
from transformer_vq import TransformerVQ, TransformerVQConfig, preset  # noqa: E402
from transformer_vq.config import ConfigError  # noqa: E402
from transformer_vq.hf import TransformerVQForCausalLM, TransformerVQHFConfig  # noqa: E402


def test_config_round_trips_every_field(tmp_path):
    cfg = preset("pg19", n_layers=2, head_type="mqa", n_head=4, attn_type="flash", dropres=0.3)
    TransformerVQHFConfig.from_model_config(cfg).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "transformer_vq"
    assert {name: saved[name] for name in cfg.to_dict()} == cfg.to_dict()  # defaults written too
    assert AutoConfig.from_pretrained(tmp_path).model_config() == cfg


def test_config_refuses_what_the_library_refuses():
    with pytest.raises(ConfigError, match="d_model must be even"):
        TransformerVQHFConfig(d_model=33)


def test_config_defaults_are_the_library_defaults():
    assert TransformerVQHFConfig().model_config() == TransformerVQConfig()


def test_hf_config_carries_the_span_and_reads_old_files_as_window(tmp_path):
    TransformerVQHFConfig.from_model_config(preset("tiny", bias_span="block")).save_pretrained(tmp_path)
    assert TransformerVQHFConfig.from_pretrained(tmp_path).model_config().bias_span == "block"
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["bias_span"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert TransformerVQHFConfig.from_pretrained(tmp_path).model_config().bias_span == "window"


@pytest.mark.parametrize("auto", [AutoModelForCausalLM, AutoModel])
def test_save_and_load_give_the_same_logits_and_buffers(tmp_path, auto):
    lib = tiny_model(tie_embeddings=True, final_norm=True)
    for quantizer in lib.quantizers:  # codebooks that differ from their initial value, as after training
        quantizer.ema_sum.mul_(1.5)
        quantizer.ema_count.add_(2.0)
        quantizer.updates_unused.fill_(3.0)
    TransformerVQForCausalLM.from_library_model(lib).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == 0o644  # safetensors 0.8 alone leaves 0600
    loaded = auto.from_pretrained(tmp_path)
    assert isinstance(loaded, TransformerVQForCausalLM) and not loaded.training
    state = loaded.model.state_dict()
    assert state.keys() == lib.state_dict().keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in lib.state_dict().items())
    # the quantizers' per-step statistics are not saved: they come back as built, zero
    assert all(float(buffer.abs().sum()) == 0 for name, buffer in loaded.model.named_buffers()
               if name.split(".")[-1] in ("acc_sum", "acc_count", "acc_recent", "acc_recent_n", "last_count"))
    x = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded(x).logits, lib(x).logits)


def test_fresh_model_is_the_library_initialization():
    torch.manual_seed(5)
    lib = TransformerVQ(preset("tiny"))
    torch.manual_seed(5)
    hf = TransformerVQForCausalLM(TransformerVQHFConfig.from_model_config(preset("tiny")))
    assert all(torch.equal(hf.model.state_dict()[name], tensor) for name, tensor in lib.state_dict().items())


def test_an_encoder_is_not_a_causal_lm():
    with pytest.raises(ValueError, match=r"needs a causal model; this config is an encoder \(causal=False\)"):
        TransformerVQForCausalLM(TransformerVQHFConfig.from_model_config(preset("tiny", causal=False)))


@pytest.mark.parametrize("damage", ["missing", "unexpected", "mis-shaped"])
def test_a_directory_without_exactly_the_models_tensors_is_refused(tmp_path, damage):
    """transformers would allocate a missing tensor and carry on: a missing EMA count came back as uninitialized
    memory and NaN logits. The load is refused, every offending name listed."""
    from safetensors.torch import load_file, save_file

    TransformerVQForCausalLM.from_library_model(tiny_model()).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.units.0.quantizer.ema_count"
    if damage == "missing":
        del tensors[name], tensors["model.units.1.u"]
        expected = r"missing keys: model.units.0.quantizer.ema_count, model.units.1.u\b"
    elif damage == "unexpected":
        tensors["model.units.9.w_q.weight"] = torch.zeros(2)
        expected = r"unexpected keys: model.units.9.w_q.weight"
    else:
        tensors[name] = torch.ones(tensors[name].numel() + 1)
        expected = r"mismatched keys: .*ema_count"
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=expected):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_model_field_edited_after_building_is_refused_before_forward_or_save(tmp_path):
    """The built model cannot follow `config.block_len = 4`: forward refused to run the old architecture under the
    new config, and save_pretrained to write the new config beside the old weights (a directory that loaded as
    another model). The directory of an earlier save stays as it was."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    x = torch.randint(0, 64, (1, 11), generator=torch.Generator().manual_seed(1))
    saved, fresh = tmp_path / "saved", tmp_path / "fresh"
    hf.save_pretrained(saved)
    files = {path.name: path.read_bytes() for path in saved.iterdir()}
    hf.config.block_len = 4
    refusal = r"config.block_len is 4 but this model was built with block_len=8.*TransformerVQForCausalLM\(config\)"
    with pytest.raises(ValueError, match=refusal):
        hf(x)
    with pytest.raises(ValueError, match=refusal):
        hf.save_pretrained(saved)
    assert {path.name: path.read_bytes() for path in saved.iterdir()} == files
    with pytest.raises(ValueError, match=refusal):
        hf.save_pretrained(fresh)
    assert not fresh.exists()
    rebuilt = TransformerVQForCausalLM.from_pretrained(saved, block_len=4)  # the way to get the edited model
    assert rebuilt.model.cfg.block_len == 4 and rebuilt(x).logits.shape == (1, 11, 64)


def test_transformers_own_config_fields_stay_editable(tmp_path):
    """Only the library's fields are the architecture: transformers' own settings change and save freely."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model()).eval()
    hf.config.use_cache = False
    hf.config.output_attentions = False
    hf.config.name_or_path = "elsewhere"
    assert hf(torch.tensor([[1, 2, 3]])).past_key_values is None
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["use_cache"] is False


def test_an_invalid_config_is_refused_before_its_directory_is_written(tmp_path):
    """transformers validated inside to_json_file, after opening config.json: an invalid field emptied a good one."""
    config = TransformerVQHFConfig.from_model_config(preset("tiny"))
    config.save_pretrained(tmp_path)
    good = (tmp_path / "config.json").read_bytes()
    config.d_model = 33
    for save in (config.save_pretrained, lambda path: config.to_json_file(path / "config.json")):
        with pytest.raises(ConfigError, match="d_model must be even"):
            save(tmp_path)
        assert (tmp_path / "config.json").read_bytes() == good
    with pytest.raises(ConfigError, match="d_model must be even"):
        config.save_pretrained(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("tied", [False, True])
def test_the_vocabulary_cannot_be_resized(tied):
    """transformers resized the embedding in place and then failed on the head: the model took ids its head cannot
    predict. Any other size is refused before anything changes; the model's own size is a no-op."""
    hf = TransformerVQForCausalLM.from_library_model(tiny_model(tie_embeddings=tied)).eval()
    state = {name: tensor.clone() for name, tensor in hf.state_dict().items()}
    refusal = r"cannot {}: its vocabulary of 64 tokens .*\(tvq train --vocab-size N\)"
    for resize in (dict(new_num_tokens=70), dict(new_num_tokens=32), dict(pad_to_multiple_of=48)):
        with pytest.raises(ValueError, match=refusal.format(r"resize its token embeddings to \d+")):
            hf.resize_token_embeddings(**resize)
    with pytest.raises(ValueError, match=refusal.format("replace its token embedding")):
        hf.set_input_embeddings(torch.nn.Embedding(70, 32))
    with pytest.raises(ValueError, match=refusal.format("replace its output head")):
        hf.set_output_embeddings(torch.nn.Linear(32, 70))
    assert hf.resize_token_embeddings(64, pad_to_multiple_of=16) is hf.model.embed
    assert hf.resize_token_embeddings() is hf.model.embed
    assert hf.config.vocab_size == 64 and hf.model.embed.num_embeddings == 64
    assert all(torch.equal(tensor, state[name]) for name, tensor in hf.state_dict().items())
