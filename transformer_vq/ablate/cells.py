"""One cell of an experiment matrix: its run config, the process that trains it, and its record read back from the
run's ``metrics.jsonl``.

A cell trains in a child process through :func:`transformer_vq.train.train` with ``resume="auto"``: a crash stays in
its process, and a cell killed midway continues from its last checkpoint the next time the matrix runs. A cell of a
matrix with a probe is then scored in the same process (:func:`score_recall`, ``recall.json`` in its run directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from transformer_vq.config import ConfigError, RunConfig, TrainConfig, load_config
from transformer_vq.config.ablate import AblateConfig, Matrix
from transformer_vq.config.applies import turns_off, unmet, where_text
from transformer_vq.config.arch import run_context
from transformer_vq.config.fields import fields_of
from transformer_vq.config.load import parse_override
from transformer_vq.config.reading import UnreadableFile, read_text


def cell_id(cell: str, seed: int) -> str:
    """The name of one training of the matrix: its cell and seed (``vq-seed0``)."""
    return f"{cell}-seed{seed}"


def cell_config(cfg: AblateConfig, matrix: Matrix, cell: str, seed: int, work_dir: Path) -> RunConfig:
    """The run config of ``cell`` at ``seed``: preset, then the matrix's base, the run's overrides, the cell's own.

    Raises :class:`ConfigError` naming the matrix and the cell (e.g. a field this version of the library lacks).
    """
    train = cfg.cell_train(seed, str(work_dir / "runs" / cell_id(cell, seed)))
    try:  # the matrix-wide options apply to the cells they apply to (n_code to the VQ cells); a cell's own, to it
        return load_config(cfg.preset, overrides=matrix.cells[cell], shared=(*matrix.base, *cfg.overrides),
                           values={"model": {}, "train": train}, arch_flag=False)
    except ConfigError as err:
        own = [(name, text) for name, text in err.problems if name in train and name in fields_of(AblateConfig)]
        if err.cls is TrainConfig and own and len(own) == len(err.problems):
            # the value came from this command's own flag (--eval-tokens, --seq-len): name the flag, as tvq train does
            raise ConfigError(f"invalid AblateConfig: {err}", own, AblateConfig) from None
        set_by = {parse_override(item)[1]: f"--set {item}" for item in cfg.overrides}  # the --set that gave a field
        raise ConfigError(f"matrix {matrix.name!r}, cell {cell!r}: {err.detail(set_by)}") from None


def refuse_unread(cfg: AblateConfig, configs: list[RunConfig]) -> None:
    """Refuse (:class:`ConfigError`) an ``--set`` that applies to none of the cells about to train (``mask_rate``
    where every cell is causal): it would change nothing, and the report would still name it. One that applies to
    some cells is theirs (``n_code`` to the VQ cells of the attention matrix)."""
    for item in cfg.overrides:
        section, key, _ = parse_override(item)
        part = getattr(configs[0], section)
        field = fields_of(type(part))[key]
        missed = {", ".join(unmet(field, run_context(run_cfg))) for run_cfg in configs}
        if "" not in missed and not turns_off(field, getattr(part, key)):
            raise ConfigError(f"--set {item}: {key} applies only with {where_text(field)}, and no cell of this run "
                              f"has that ({'; '.join(sorted(missed))}): it would change nothing; leave it out")


def preset_note(cfg: AblateConfig, matrix: Matrix, configs: dict, work_dir: Path) -> str | None:
    """A note when ``--preset`` changes no model of ``configs`` (the run's cells, by ``(cell, seed)``): the
    matrix's base sets every field in which it differs from the default preset (the recall matrix's tiny is its
    small). None otherwise."""
    default = fields_of(AblateConfig)["preset"].default
    if cfg.preset == default:
        return None
    usual = dataclasses.replace(cfg, preset=default)
    if any(cell_config(usual, matrix, *job, work_dir).model != run_cfg.model for job, run_cfg in configs.items()):
        return None
    return (f"note: --preset {cfg.preset} changes none of these cells: matrix {matrix.name!r} sets every field in "
            f"which it differs from {default} (its base: {' '.join(matrix.base)})")


def child_command(request: Path, probe: str | None = None) -> list[str]:
    """The command line of the process that trains one cell from its request file (the run config as JSON), then
    scores it on ``probe`` (see :attr:`Matrix.probe`) when one is named."""
    return [sys.executable, "-m", "transformer_vq.ablate", str(request), *([probe] if probe else [])]


def score_recall(run_cfg: RunConfig) -> dict:
    """Score the trained recall-probe run of ``run_cfg`` on its test episodes, as ``tvq eval --split test`` does:
    answer accuracy by distance (:meth:`~transformer_vq.train.lm.recall.RecallResult.to_dict`), from its last
    checkpoint, with the state carried across windows of its ``update_len``. Written to ``recall.json`` in the run
    directory and returned."""
    from transformer_vq import fileio
    from transformer_vq.train.lm.build import load_corpus_for, model_from_checkpoint
    from transformer_vq.train.lm.recall import recall_accuracy

    run_dir = run_cfg.train.resolved_run_dir()
    model, run_cfg, _ = model_from_checkpoint(str(run_dir), device=run_cfg.train.device)
    corpus = load_corpus_for(run_cfg.train, run_dir=run_dir)
    result = recall_accuracy(model, corpus, "test", block_len=run_cfg.model.block_len,
                             window_len=run_cfg.train.update_len).to_dict()
    fileio.atomic_write_text(run_dir / "recall.json", json.dumps(result))
    print(f"recall on {result['episodes']} test episodes: accuracy {result['accuracy']:.1%} "
          f"(chance {result['chance']:.0%})", flush=True)
    return result


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The training rows (one per step) and validation rows of a run's ``metrics.jsonl``.

    A resumed run repeats the steps between its last checkpoint and the kill: the later row of a step wins.
    """
    train, evals = {}, {}
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "eval" in row:
                evals[row["step"]] = row
            else:
                train[row["step"]] = row
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def cell_record(cell: str, seed: int, run_dir: Path, wall_s: float) -> dict:
    """What the report keeps of one finished cell: per-step training loss and bpb with the cumulative training
    seconds, the validation curve on the same clock, codebook usage over training, the final validation bpb, and
    the probe's score when the cell was scored (``recall``)."""
    train, evals = read_metrics(run_dir)
    elapsed, seconds = 0.0, {}
    for row in train:
        elapsed += row["seconds"]
        seconds[row["step"]] = elapsed
    record = {
        "cell": cell, "seed": seed, "status": "done", "wall_s": round(wall_s, 2),
        "train_seconds": round(elapsed, 2),
        "steps": [row["step"] for row in train],
        "seconds": [round(seconds[row["step"]], 3) for row in train],
        "loss": [row["loss"] for row in train],
        "bits_per_byte": [row["bits_per_byte"] for row in train],
        "validation": [{"step": row["step"], "seconds": round(seconds.get(row["step"], elapsed), 3),
                        "bits_per_byte": row["bits_per_byte"]} for row in evals],
    }
    if train and "codebook_perplexity" in train[0]:
        record["codebook_perplexity"] = [row.get("codebook_perplexity") for row in train]
        record["codebook_unused"] = [row.get("codebook_unused") for row in train]
    record["final_bpb"] = record["validation"][-1]["bits_per_byte"] if evals else None
    if (Path(run_dir) / "recall.json").is_file():
        record["recall"] = json.loads((Path(run_dir) / "recall.json").read_text())
    return record


def main(argv: list[str] | None = None) -> int:
    """Child process: train the cell of the request file, resuming its run directory when it has checkpoints, then
    score it when a probe is named after the file."""
    from transformer_vq.train import train
    from transformer_vq.train.signals import stop_with_parent

    parser = argparse.ArgumentParser(prog="python -m transformer_vq.ablate", description=(
        "Train one cell of tvq ablate from its request file (the cell's run config as JSON: tvq ablate writes it as "
        "request.json in the cell's run directory), resuming the run when it has checkpoints; then score it with the "
        "probe."))
    parser.add_argument("request", type=Path, help="the cell's request file (JSON run config)")
    parser.add_argument("probe", nargs="?", choices=["recall"], help="score the trained cell with this probe")
    args = parser.parse_args(argv)
    stop_with_parent()  # a killed runner takes its trainings with it (each saves first)
    try:
        text = read_text(args.request, "a tvq ablate cell's request (JSON run config)",
                         "pass the request file tvq ablate wrote for the cell")
    except UnreadableFile as err:
        parser.error(str(err))
    run_cfg = RunConfig.from_dict(json.loads(text))
    result = train(run_cfg, resume="auto")
    if result.exit_code == 0 and args.probe == "recall":
        score_recall(run_cfg)
    return result.exit_code

