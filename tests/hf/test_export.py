"""`tvq export`: a run made by `tvq train` becomes a transformers directory or one safetensors file whose logits are
bitwise the run's; bad inputs are one-line errors."""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from transformer_vq.cli import main  # noqa: E402
from transformer_vq.export import load_safetensors  # noqa: E402
from transformer_vq.train.lm.build import model_from_checkpoint  # noqa: E402


def run_logits(run_dir, x):
    model, _, _ = model_from_checkpoint(str(run_dir), device="cpu")
    return model(x).logits


def error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()


X = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(0))


def test_hf_export_gives_the_run_logits(trained_run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", "--format", "hf", "--ckpt", str(trained_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (hf)"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "modeling_transformer_vq.py", "tokenizer.json",
                                                     "tokenizer_config.json"]  # test_self_contained.py: the last three
    model = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(model(X).logits, run_logits(trained_run, X))


def test_safetensors_export_gives_the_run_logits(trained_run, tmp_path):
    out = tmp_path / "st"
    out.mkdir()  # an empty directory is accepted
    assert main(["export", "--format", "safetensors", "--ckpt", str(trained_run), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = load_safetensors(out)
    reference, _, _ = model_from_checkpoint(str(trained_run), device="cpu")
    assert model.state_dict().keys() == reference.state_dict().keys()  # weights and codebooks, nothing else
    assert torch.equal(model(X).logits, reference(X).logits)


def test_out_that_is_not_empty_is_refused(trained_run, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    line = error_line(capsys, ["export", "--ckpt", str(trained_run), "--out", str(tmp_path)])
    assert line == f"error: --out: {tmp_path} is a directory that is not empty; pass a new or empty directory"
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_missing_out_is_refused(trained_run, capsys):
    assert error_line(capsys, ["export", "--ckpt", str(trained_run)]) == \
        "error: --out: is required: pass the directory to write"


def test_bad_ckpt_is_refused(tmp_path, capsys):
    line = error_line(capsys, ["export", "--ckpt", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    assert line.startswith(f"error: checkpoint path {tmp_path / 'nothing'} does not exist")
    assert not (tmp_path / "o").exists()


def test_hf_without_transformers_says_what_to_install(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what find_spec reports when it is not installed
    line = error_line(capsys, ["export", "--format", "hf", "--ckpt", str(trained_run), "--out", str(tmp_path / "o")])
    assert line == ("error: --format hf needs transformers: install the extra hf (pip install -e '.[hf]' in "
                    "the checkout, or pip install 'transformers>=5.0,<6')")


def test_a_safetensors_directory_without_exactly_the_models_tensors_is_refused(trained_run, tmp_path):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "st"
    assert main(["export", "--format", "safetensors", "--ckpt", str(trained_run), "--out", str(out)]) == 0
    tensors = load_file(out / "model.safetensors")
    del tensors["units.0.quantizer.ema_count"]
    tensors["units.7.extra"] = torch.zeros(1)
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing: units.0.quantizer.ema_count; unexpected: units.7.extra\)"):
        load_safetensors(out)


def test_a_learned_cache_bias_is_exported(tmp_path):
    """A run with ``--cache-bias-init`` (an extension of the paper's model, docs/quality.md): its per-head logits
    travel in both formats, and the loaded model gives the run's logits, which the bias changes (the cache is in
    play: 37 tokens are several tiny blocks)."""
    corpus = tmp_path / "plays.txt"
    corpus.write_text("the king shall speak to thee of love and war, my lord; good night.\n" * 500)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", "text", "--data-path", str(corpus), "--run-dir", str(run),
                 "--seq-len", "32", "--update-len", "16", "--batch-size", "4", "--steps", "2", "--sample-tokens", "0",
                 "--eval-tokens", "0", "--log-every", "1000", "--cache-bias-init", "-3"]) == 0
    reference, _, _ = model_from_checkpoint(str(run), device="cpu")
    assert any(name.endswith("cache_bias") for name in reference.state_dict())
    assert main(["export", "--format", "hf", "--ckpt", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "hf")(X).logits, reference(X).logits)
    (tmp_path / "st").mkdir()
    assert main(["export", "--format", "safetensors", "--ckpt", str(run), "--out", str(tmp_path / "st")]) == 0
    assert torch.equal(load_safetensors(tmp_path / "st")(X).logits, reference(X).logits)
    for unit in reference.units:
        unit.cache_bias.data.zero_()
    assert not torch.equal(reference(X).logits, load_safetensors(tmp_path / "st")(X).logits)
