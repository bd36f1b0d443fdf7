"""transformers' Trainer trains an exported model (weights by the optimizer, codebooks by CodebookCallback), and
what save_model writes loads back with the trained model's logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate: pip install 'transformer-vq[eval]'")

from transformers import AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: E402

from conftest import LINE  # noqa: E402
from transformer_vq.data.codec import encode_bytes  # noqa: E402
from transformer_vq.hf.trainer import CodebookCallback  # noqa: E402

X = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(0))


def test_trainer_trains_saves_and_loads_back(exported, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(exported)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    ids = encode_bytes(LINE * 20)
    rows = [{"input_ids": ids[i:i + 32], "labels": ids[i:i + 32]} for i in range(0, 32 * 8, 32)]
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=4, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, learning_rate=3e-3, use_cpu=True, report_to="none",
                             save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[CodebookCallback()])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    after = model.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert "model.embed.weight" in changed  # the optimizer's step
    assert "model.units.0.quantizer.ema_sum" in changed and "model.units.0.quantizer.ema_count" in changed  # EMA

    trainer.save_model(str(tmp_path / "saved"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(X).logits, model(X).logits)
