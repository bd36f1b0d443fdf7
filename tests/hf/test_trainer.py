"""transformers' Trainer trains an exported model (weights by the optimizer, codebooks by CodebookCallback), and
what save_model writes loads back with the trained model's logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate: pip install -e '.[eval]'")

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


def test_trainer_with_flattened_documents(exported, tmp_path):
    """DataCollatorWithFlattening packs a batch's documents into one row with position_ids restarting at 0 (and -100
    on each document's first label): the loss the Trainer minimizes is the documents' own, none predicted from or
    attending to another, and training runs on it."""
    from transformers import DataCollatorWithFlattening

    model = AutoModelForCausalLM.from_pretrained(exported).double()
    ids = encode_bytes(LINE * 4)
    docs = [ids[a:b] for a, b in ((0, 9), (9, 10), (10, 41), (41, 66))]  # one of a single token
    collate = DataCollatorWithFlattening()
    batch = collate([{"input_ids": d, "labels": d} for d in docs])
    assert batch["input_ids"].shape == (1, 66)
    model.eval()
    with torch.no_grad():
        packed = model(**batch)
        start, ce_sum, n_targets = 0, 0.0, 0
        for d in docs:
            alone = model(torch.tensor([d]))
            torch.testing.assert_close(packed.logits[0, start:start + len(d)], alone.logits[0], rtol=0, atol=1e-12)
            if len(d) > 1:
                targets = torch.tensor(d[1:])
                ce_sum += torch.nn.functional.cross_entropy(alone.logits[0, :-1], targets, reduction="sum")
                n_targets += len(d) - 1
            start += len(d)
        lib = model.model  # the commitment term: per token, averaged over the documents' tokens
        commit = sum(lib(torch.tensor([d])).commit_loss * len(d) for d in docs) / sum(len(d) for d in docs)
    torch.testing.assert_close(packed.loss, ce_sum / n_targets + lib.cfg.commit_coef * commit, rtol=1e-12, atol=0)
    model.train()
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=2, per_device_train_batch_size=4,
                             learning_rate=3e-3, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                             disable_tqdm=True, seed=0)
    rows = [{"input_ids": d, "labels": d} for d in docs * 2]
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate,
                      callbacks=[CodebookCallback()])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
