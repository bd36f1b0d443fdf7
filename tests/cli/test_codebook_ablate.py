"""`tvq codebook` against a hand computation, and `tvq ablate` end to end: one cell in its own process."""

from __future__ import annotations

import json
import math

import pytest
import torch

import transformer_vq.ablate as ablate
from transformer_vq import TransformerVQ, preset
from transformer_vq.cli import main
from transformer_vq.config import RunConfig, TrainConfig
from transformer_vq.train.checkpoint import save_checkpoint


@pytest.fixture
def known_codebooks(tmp_path):
    """A run directory whose checkpoint has EMA counts chosen by hand, and a metrics.jsonl of three steps."""
    cfg = RunConfig(model=preset("tiny", n_layers=1, n_code=8, block_len=8), train=TrainConfig(update_len=16))
    model = TransformerVQ(cfg.model)
    counts = [[4.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0] * 8]
    unused = [[0, 0, 0, 0, 3, 100, 250, 1], [0] * 8]
    for unit, c, u in zip(model.units, counts, unused):
        unit.quantizer.ema_count.copy_(torch.tensor([c]))
        unit.quantizer.updates_unused.copy_(torch.tensor([u], dtype=torch.float32))
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", step=7, model=model, config=cfg.to_dict(), state={}, keep=1)
    rows = [{"step": s, "codebook_perplexity": p, "codebook_unused": 0.5} for s, p in ((1, 2.0), (2, 3.0), (2, 4.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_codebook_figures_equal_a_hand_computation(known_codebooks, tmp_path, capsys):
    assert main(["codebook", "--ckpt", str(known_codebooks), "--out", str(tmp_path / "figs"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    first, second = report["units"]
    # shares 1/2, 1/4, 1/8, 1/8: entropy 1.75 bits, perplexity 2^1.75
    assert first["perplexity"] == pytest.approx(2 ** 1.75, rel=1e-12)
    assert (first["unused"], first["dead"]) == (4, 2)  # unused in the last update: 4; for >= 100 updates: 2
    assert first["top_shares"][:3] == [[0, 0.5], [1, 0.25], [2, 0.125]]
    assert second["perplexity"] == pytest.approx(8.0, rel=1e-12) and second["unused"] == 0
    assert report["step"] == 7 and sorted(report["figures"]) == ["training", "usage"]
    assert (tmp_path / "figs" / "codebook-usage.png").stat().st_size > 0
    assert any(p.name.startswith("events") for p in (known_codebooks / "tb").iterdir())  # in TensorBoard too


def test_codebook_out_that_cannot_hold_the_figures_is_refused_by_name(known_codebooks, tmp_path, capsys):
    """As export's, bench's and ablate's: once an OSError naming the path and neither the flag nor the command."""
    (tmp_path / "f.txt").write_text("x")
    assert main(["codebook", "--ckpt", str(known_codebooks), "--out", str(tmp_path / "f.txt")]) == 2
    assert capsys.readouterr().err == (f"error: --out: {tmp_path / 'f.txt'} is a file, not a directory; remove it "
                                       f"or choose another path\n")
    assert main(["codebook", "--ckpt", str(known_codebooks), "--out", str(tmp_path / "f.txt" / "figs")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out: cannot make the directory {tmp_path / 'f.txt' / 'figs'}")


def test_codebook_training_curve_keeps_the_later_row_of_a_repeated_step(known_codebooks):
    from transformer_vq.ablate.codebook import training_curve

    assert training_curve(known_codebooks) == {"steps": [1, 2], "perplexity": [2.0, 4.0], "unused": [0.5, 0.5]}


def test_codebook_console_table(known_codebooks, tmp_path, capsys):
    assert main(["codebook", "--ckpt", str(known_codebooks), "--out", str(tmp_path), "--no-tensorboard"]) == 0
    out = capsys.readouterr().out
    assert f"   0 key       0     8 {2 ** 1.75:>10.2f}      4     2  0: 0.500  1: 0.250  2: 0.125" in out
    assert not (known_codebooks / "tb").exists()


def test_ablate_command_trains_a_cell_in_its_own_process(tmp_path, capsys):
    argv = ["ablate", "--matrix", "codebook", "--preset", "tiny", "--data", "shakespeare", "--steps", "2",
            "--seeds", "0", "--seq-len", "32", "--update-len", "16", "--batch-size", "2", "--eval-tokens", "64",
            "--set", "n_code=4", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--name", "t"]
    from transformer_vq.config import ablate

    one_cell = ablate.Matrix("codebook", "one cell", {"S4": ()}, reference="S4", base=("block_len=8",))
    saved = ablate.MATRICES["codebook"]
    ablate.MATRICES["codebook"] = one_cell
    try:
        assert main(argv) == 0
    finally:
        ablate.MATRICES["codebook"] = saved
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "w" / "cells" / "S4-seed0.json").read_text())
    assert record["steps"] == [1, 2] and math.isfinite(record["final_bpb"])
    assert f"| S4 |  | 1 | {record['final_bpb']:.4f} +- - |" in out  # one seed: no spread
    assert "training a" in (tmp_path / "w" / "runs" / "S4-seed0" / "train.log").read_text()  # the child's output


def test_ablate_exits_non_zero_naming_every_failed_training(tmp_path, capsys, monkeypatch):
    """The shared rule of batch commands (transformer_vq/cli/batch.py): the report is printed, then each failed
    training is named with its reason and the exit status is 1."""
    report = tmp_path / "r.md"
    report.write_text("the report\n")
    summary = [{"cell": "vq", "failed": []}, {"cell": "full", "failed": ["seed 1: RuntimeError: boom"]}]
    monkeypatch.setattr(ablate, "run_ablation", lambda cfg: {"summary": summary, "paths": {"md": str(report)}})
    assert main(["ablate", "--matrix", "attention", "--seeds", "0", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("the report\n")
    assert captured.err.splitlines() == ["error: 1 of 4 trainings failed:", "  full: seed 1: RuntimeError: boom",
                                         "rerun the same command to retry them"]
    summary[1]["failed"] = []
    assert main(["ablate", "--matrix", "attention", "--seeds", "0", "1"]) == 0


def test_a_run_without_codebooks_is_refused_naming_the_commands_that_read_it(tmp_path, capsys):
    cfg = RunConfig(model=preset("tiny", n_layers=1, attn_type="full"), train=TrainConfig(update_len=16))
    save_checkpoint(tmp_path / "run" / "checkpoints", step=1, model=TransformerVQ(cfg.model), config=cfg.to_dict(),
                    state={}, keep=1)
    assert main(["codebook", "--ckpt", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert "has no codebook (attn_type 'full')" in err and "for this run use tvq eval, tvq export, tvq sample" in err
