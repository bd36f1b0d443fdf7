"""Does the compressive cache carry information beyond the two-block window? The recall probe (``--data recall``)
trained and scored for several models with the same data, steps, batch and seeds.

    python benchmarks/memory_probe.py [--size real|tiny] [--seeds 0 1] [--steps N]
        [--variant NAME[:FIELD=VALUE,...]]... [--out benchmarks/results] [--name NAME] [--threads N]

Each variant is a set of model-config overrides applied to the base model of ``--size``; the default variants are
``vq`` (Transformer-VQ), ``vq-window`` (``compressive_cache=false``: the window only, the paper's Table 2 ablation)
and ``full`` (``attn_type=full``: unquantized keys, every key and value kept). A variant whose fields this build of
the library does not have (``compressive_cache`` before the ablation work is merged) is reported as skipped, not
fatal. Every cell trains with :func:`transformer_vq.train.train` (one episode per training sequence, the state
carried across its backprop windows) and is scored with :func:`transformer_vq.train.recall.recall_accuracy` on the
test episodes. Writes ``NAME.json`` (every cell's config, accuracy by distance, training time, the machine and
commit; rewritten after every cell), ``NAME.md`` (the table) and ``NAME.png`` (accuracy against distance).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from transformer_vq import TransformerVQ
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.recall_plot import comparison_table, plot_recall
from transformer_vq.config import ConfigError, RunConfig, TrainConfig, TransformerVQConfig, preset
from transformer_vq.train import train
from transformer_vq.train.build import load_corpus_for
from transformer_vq.train.recall import recall_accuracy

VARIANTS = {"vq": {}, "vq-window": {"compressive_cache": False}, "full": {"attn_type": "full"}}

# "real": sized for a 2-core CPU (see docs/quality.md, "Memory probe"); "tiny": the one-minute check of the script itself
SIZES = {
    "real": {"model": {"d_model": 128, "d_k": 32, "d_v": 256, "n_layers": 2, "n_code": 64, "block_len": 32,
                       "dropsin": 0.0},
             "train": {"seq_len": 1024, "update_len": 128, "batch_size": 8, "steps": 3000, "warmup_steps": 50},
             "data": {"n_pairs": 8, "train_episodes": 2048, "eval_episodes": 64}},
    "tiny": {"model": {"d_model": 32, "d_k": 16, "d_v": 64, "n_layers": 1, "n_code": 8, "block_len": 8,
                       "dropsin": 0.0},
             "train": {"seq_len": 128, "update_len": 32, "batch_size": 2, "steps": 8, "warmup_steps": 2},
             "data": {"n_pairs": 4, "train_episodes": 8, "eval_episodes": 4}},
}


def parse_variant(text: str) -> tuple[str, dict]:
    """``"vq-window:compressive_cache=false,n_code=32"`` -> ``("vq-window", {...})``; a bare known name gives its
    default overrides. Values are YAML scalars (``false``, ``32``, ``full``)."""
    name, _, rest = text.partition(":")
    if not rest:
        if name not in VARIANTS:
            raise SystemExit(f"--variant {text!r}: unknown name; give overrides as NAME:FIELD=VALUE,... or one of "
                             f"{', '.join(VARIANTS)}")
        return name, dict(VARIANTS[name])
    overrides = {}
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} must look like FIELD=VALUE")
        overrides[key.strip()] = yaml.safe_load(value)
    return name, overrides


def run_cell(name: str, overrides: dict, seed: int, size: dict, steps: int, threads: int, work: Path, log=print):
    """Train one (variant, seed) cell and score it: a result row (``status`` 'ok', or 'skipped' with the reason)."""
    base = preset("small").to_dict() | size["model"]
    try:
        model_cfg = TransformerVQConfig.from_dict(base | overrides)
    except ConfigError as error:  # e.g. a field this build lacks: the rest of the matrix still runs
        reason = str(error).split("; known keys")[0]
        log(f"skip {name}: {reason}")
        return {"variant": name, "seed": seed, "overrides": overrides, "status": "skipped", "reason": reason}
    train_cfg = TrainConfig(name=f"{name}-{seed}", run_dir=str(work / f"{name}-seed{seed}"), data="recall",
                            data_options=dict(size["data"]), seed=seed, steps=steps, threads=threads,
                            sample_tokens=0, eval_tokens=size["train"]["seq_len"], ckpt_every=steps,
                            log_every=max(1, steps // 10), **{k: v for k, v in size["train"].items() if k != "steps"})
    cfg = RunConfig(model=model_cfg, train=train_cfg)
    model = TransformerVQ(model_cfg)
    begin = time.perf_counter()
    train(cfg, model=model)
    train_s = time.perf_counter() - begin
    result = recall_accuracy(model, load_corpus_for(train_cfg), "test", block_len=model_cfg.block_len,
                             window_len=train_cfg.update_len, batch_size=16)
    log(f"{name} seed {seed}: accuracy {result.accuracy:.1%} (chance {result.chance:.0%}), trained in {train_s:.0f} s")
    return {"variant": name, "seed": seed, "overrides": overrides, "status": "ok", "train_s": train_s,
            "config": cfg.to_dict(), "recall": result.to_dict()}


def report(result: dict, out: Path, name: str) -> str:
    """Write NAME.json, and NAME.md / NAME.png when some cell ran; returns the table (or a note)."""
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    models: dict[str, list[dict]] = {}
    for row in result["rows"]:
        if row["status"] == "ok":
            models.setdefault(row["variant"], []).append(row["recall"])
    skipped = [f"- {r['variant']} seed {r['seed']} skipped: {r['reason']}" for r in result["rows"]
               if r["status"] == "skipped"]
    if not models:
        return "\n".join(["no cell ran"] + skipped)
    block_len = next(iter(models.values()))[0]["block_len"]
    table = "\n".join([f"### Recall accuracy against distance ({result['size']} size, {result['steps']} steps, "
                       f"L = {block_len}, test episodes)", "", comparison_table(models), ""] + skipped)
    (out / f"{name}.md").write_text(table + "\n")
    plot_recall(models, out / f"{name}.png")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="real")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per cell (default: the size's)")
    parser.add_argument("--variant", action="append", default=None,
                        help="NAME or NAME:FIELD=VALUE,... (repeatable; default: " + ", ".join(VARIANTS) + ")")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    size = SIZES[args.size]
    steps = args.steps or size["train"]["steps"]
    variants = [parse_variant(v) for v in args.variant or list(VARIANTS)]
    machine = machine_info(measure_peak=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"memory-probe-{args.size}-{machine['date_utc'][:10]}-{machine['logical_cpus']}cpu"
    result = {"benchmark": "memory-probe", "size": args.size, "steps": steps, "seeds": args.seeds, "rows": [],
              "machine": machine}
    with tempfile.TemporaryDirectory(prefix="memory-probe-") as work:
        for variant, overrides in variants:
            for seed in args.seeds:
                result["rows"].append(run_cell(variant, overrides, seed, size, steps, args.threads, Path(work)))
                report(result, out, name)
    print(report(result, out, name))


if __name__ == "__main__":
    main()
