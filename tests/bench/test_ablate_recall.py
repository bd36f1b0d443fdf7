"""`tvq ablate --matrix recall` (the memory probe): the matrix's own defaults under the user's values, a tiny recall
matrix end to end in this process (every cell scored on the test episodes, the table and plot in its report), the
child's scoring, and the comparison table and plot of the recall probe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from transformer_vq.ablate import AblateConfig, Matrix, run_ablation
from transformer_vq.ablate.cells import cell_config, child_command, main as cell_main
from transformer_vq.ablate.recall_plot import comparison_table, plot_recall
from transformer_vq.ablate.report import command_line
from transformer_vq.ablate.runner import _hold_settings
from transformer_vq.cli import build_parser
from transformer_vq.config import ConfigError
from transformer_vq.config.ablate import MATRICES
from transformer_vq.config.flags import given
from transformer_vq.config.fields import build
from transformer_vq.train import evaluate
from transformer_vq.train.lm.recall import accuracy_by_distance

RECALL_OPTIONS = {"n_pairs": 8, "train_episodes": 2048, "eval_episodes": 64}
# memory_probe's former "tiny" size: a one-layer model on 128-byte episodes of 16 blocks
TINY_MODEL = ("d_model=32", "d_k=16", "d_v=64", "n_layers=1", "n_code=8", "block_len=8", "warmup_steps=1")


def _flags(*words: str) -> AblateConfig:
    """The config `tvq ablate WORDS` runs (cli/ablate.py run())."""
    return build(AblateConfig, given(build_parser().parse_args(["ablate", *words]), AblateConfig), "ablate")


def test_the_recall_matrix_trains_with_its_own_defaults(tmp_path):
    cfg = AblateConfig(matrix="recall")
    assert (cfg.data, cfg.seq_len, cfg.update_len, cfg.batch_size, cfg.steps, cfg.data_options) == (
        "recall", 1024, 128, 8, 3000, RECALL_OPTIONS)
    assert cfg == _flags("--matrix", "recall")  # Python and the command line agree
    assert (cfg.eval_tokens, cfg.seeds, cfg.resolved_work_dir()) == (65536, (0, 1), "runs/ablate-recall")
    matrix = MATRICES["recall"]
    assert (matrix.probe, matrix.reference) == ("recall", "full")
    configs = {cell: cell_config(cfg, matrix, cell, 0, tmp_path) for cell in matrix.cells}
    for c in configs.values():
        assert (c.train.data, c.train.seq_len, c.train.update_len, c.train.batch_size, c.train.steps) == (
            "recall", 1024, 128, 8, 3000)
        assert (c.train.data_options, c.train.warmup_steps) == (RECALL_OPTIONS, 50)
        assert (c.model.d_model, c.model.d_k, c.model.d_v, c.model.n_layers, c.model.n_code, c.model.block_len,
                c.model.dropsin) == (128, 32, 256, 2, 64, 32, 0.0)
    assert [(c.model.attn_type, c.model.compressive_cache) for c in configs.values()] == [
        ("vq", True), ("vq", False), ("full", True)]
    assert AblateConfig().data == "gcide" and AblateConfig().data_options == {}  # other matrices: unchanged


def test_a_value_given_wins_over_the_matrix_default_even_when_it_is_the_usual_default():
    cfg = _flags("--matrix", "recall", "--steps", "600", "--data-option", "n_pairs=4")
    assert (cfg.steps, cfg.data_options, cfg.seq_len) == (600, {"n_pairs": 4}, 1024)  # 600 is AblateConfig's default
    assert AblateConfig(matrix="recall", data="gcide", seq_len=2048).data == "gcide"
    assert command_line(cfg) == "tvq ablate --matrix recall --steps 600 --data-option n_pairs=4"
    assert command_line(AblateConfig(matrix="recall", data="gcide")) == "tvq ablate --matrix recall --data gcide"
    copied = dataclasses.replace(cfg, seeds=(3,))  # a copy keeps every value, the matrix's defaults included
    assert (copied.steps, copied.seeds, copied.data) == (600, (3,), "recall")
    cfg = AblateConfig(matrix="recall")
    cfg.data_options["n_pairs"] = 2  # the config holds its own copy of the matrix's mapping
    assert AblateConfig(matrix="recall").data_options == RECALL_OPTIONS


def test_bad_fields_and_probes_are_refused():
    with pytest.raises(TypeError, match="AblateConfig got unknown field\\(s\\) stepz"):
        AblateConfig(matrix="recall", stepz=3)
    with pytest.raises(ValueError, match="matrix 'm': probe must be one of None, recall, got 'passkey'"):
        Matrix("m", "d", {"a": ()}, reference="a", probe="passkey")
    with pytest.raises(ConfigError, match="invalid AblateConfig: seq_len must be a positive integer, got 0"):
        AblateConfig(matrix="recall", seq_len=0)


def test_a_work_dir_of_a_version_without_the_new_fields_continues(tmp_path):
    """A settings.json written before AblateConfig had data_options and Matrix had defaults/probe: same matrix."""
    cfg = AblateConfig(matrix="codebook", work_dir=str(tmp_path / "w"))
    _hold_settings(tmp_path / "w", cfg, MATRICES["codebook"])
    saved = json.loads((tmp_path / "w" / "settings.json").read_text())
    del saved["settings"]["data_options"], saved["matrix"]["defaults"], saved["matrix"]["probe"]
    (tmp_path / "w" / "settings.json").write_text(json.dumps(saved))
    _hold_settings(tmp_path / "w", cfg, MATRICES["codebook"])  # accepted
    other = dataclasses.replace(cfg, data_options={"n_pairs": 4})
    with pytest.raises(ConfigError, match=r"other settings \(data_options differ\)"):
        _hold_settings(tmp_path / "w", other, MATRICES["codebook"])


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("recall")
    cfg = AblateConfig(matrix="recall", seeds=(0,), steps=4, seq_len=128, update_len=32, batch_size=2, eval_every=2,
                       ckpt_every=2, overrides=TINY_MODEL, threads=1,
                       data_options={"n_pairs": 4, "train_episodes": 8, "eval_episodes": 4},
                       work_dir=str(tmp_path / "work"), out=str(tmp_path / "out"), name="probe")
    return cfg, run_ablation(cfg, isolate=False, log=lambda *a: None)


def test_every_cell_is_scored_on_the_test_episodes(probed):
    cfg, result = probed
    assert [r["cell"] for r in result["cells"]] == ["vq", "vq-window-only", "full"]
    for record in result["cells"]:
        run_dir = Path(cfg.work_dir) / "runs" / f"{record['cell']}-seed0"
        recall = record["recall"]
        assert recall == json.loads((run_dir / "recall.json").read_text())
        assert recall == evaluate(str(run_dir), split="test").recall  # what tvq eval --split test reports
        assert (recall["split"], recall["episodes"], recall["block_len"], recall["chance"]) == ("test", 4, 8, 0.1)
        assert sum(b["queries"] for b in recall["buckets"]) == 16  # 4 episodes x 4 queries
        assert [b["bucket"] for b in recall["buckets"]][0] == "0-2" and record["steps"] == [1, 2, 3, 4]
        assert record["final_bpb"] == record["validation"][-1]["bits_per_byte"]  # bpb still reported


def test_the_report_has_the_recall_table_and_plot(probed):
    cfg, result = probed
    assert {Path(p).name for p in result["paths"].values()} == {
        "probe.json", "probe.md", "probe-curves.png", "probe-final.png", "probe-codebook.png", "probe-recall.png"}
    assert Path(result["paths"]["recall"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = Path(result["paths"]["md"]).read_text()
    models = {r["cell"]: [r["recall"]] for r in result["cells"]}
    assert "## Recall accuracy against distance (test split, 4 episodes, blocks of L = 8)\n\n" + \
        comparison_table(models) in text
    assert "| distance (blocks) | vq | vq-window-only | full |" in text and "| full | attn_type=full | 1 |" in text
    assert "data recall (n_pairs=4 train_episodes=8 eval_episodes=4)" in text


def test_finished_cells_keep_their_score_and_an_unscored_one_is_scored_on_resume(probed):
    cfg, result = probed
    work = Path(cfg.work_dir)
    (work / "cells" / "full-seed0.json").unlink()  # killed after training full, before scoring it
    (work / "runs" / "full-seed0" / "recall.json").unlink()
    lines = []
    again = run_ablation(cfg, isolate=False, log=lines.append)
    assert lines[:2] == ["[1/3] vq-seed0: finished earlier, skipped", "[2/3] vq-window-only-seed0: finished earlier, "
                                                                       "skipped"]
    assert [r["recall"] for r in again["cells"]] == [r["recall"] for r in result["cells"]]
    assert (work / "runs" / "full-seed0" / "recall.json").is_file()


def test_the_child_process_scores_its_cell(probed):
    cfg, result = probed
    run_dir = Path(cfg.work_dir) / "runs" / "vq-seed0"
    request = run_dir / "request.json"
    assert child_command(request, "recall")[-3:] == ["transformer_vq.ablate", str(request), "recall"]
    assert child_command(request)[-1] == str(request)
    (run_dir / "recall.json").unlink()
    assert cell_main([str(request), "recall"]) == 0  # trained already: resumes at the end, then scores
    assert json.loads((run_dir / "recall.json").read_text()) == result["cells"][0]["recall"]


def test_comparison_table_and_plot(tmp_path):
    """Two seeds show their range even where they agree; one seed shows its value alone."""
    def run(correct, accuracy):
        return {"chance": 0.1, "block_len": 8, "accuracy": accuracy,
                "buckets": accuracy_by_distance(correct, [3, 20, 40], 8)}

    models = {"vq": [run([1, 1, 0], 2 / 3), run([1, 0, 0], 1 / 3)], "full": [run([1, 1, 1], 1.0)]}
    assert comparison_table(models).splitlines() == [
        "| distance (blocks) | vq | full |", "|---|---:|---:|",
        "| 0-2 | 100.0% [100%-100%] | 100.0% |", "| 2-4 | 50.0% [0%-100%] | 100.0% |",
        "| 4-8 | 0.0% [0%-0%] | 100.0% |",
        "| all | 50.0% [33%-67%] | 100.0% |", "",
        "Mean answer accuracy over seeds [lowest-highest seed] (vq: 2, full: 1 seeds); chance 10.0%."]
    path = plot_recall(models, tmp_path / "recall.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
