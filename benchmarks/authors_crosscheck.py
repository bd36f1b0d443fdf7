"""Our layer against the authors' JAX layer in float64: the same parameters and input, the same residual branch.

    TVQ_JAX_PYTHON=/path/to/jax/venv/bin/python python benchmarks/authors_crosscheck.py \
        --authors GIT_DIR_OR_SOURCE [--case small paper] [--out benchmarks/results/NAME]

Builds one gated attention unit with ``bias_span="block"`` (the authors' span) in float64, gives it random
parameters, copies them into the authors' layer (branch ``optimized``, jax x64, serial reduction) and runs the same
input through both: our layer on the whole sequence and again in two calls carrying its state across ``split``; the
authors' whole-sequence layer and their block-by-block layer carrying its state. Reports the largest absolute and
relative (to the largest output entry) differences of the residual branch; the target is 1e-12. The same comparison
with ``bias_span="window"`` is reported too: it must differ, by the position bias beyond distance L. Writes
``NAME.json`` and ``NAME.md``. benchmarks/authors_bridge.py says where the authors' code and JAX come from.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from authors_bridge import (add_authors_flags, authors_params, authors_source, gau_config, randomize, require_authors,
                            run_jax_side)
from transformer_vq import GatedAttentionUnit
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config.flags import int_at_least, not_empty

CASES = {
    "small": dict(d_model=64, d_k=16, n_code=32, block_len=8, seq_len=64, batch=2, split=24),
    "odd-split": dict(d_model=32, d_k=8, n_code=16, block_len=4, seq_len=40, batch=3, split=10),
    "paper": dict(d_model=768, d_k=128, n_code=512, block_len=512, seq_len=2048, batch=1, split=1024),
}
"""Dimensions of the checks: ``split`` is where our second call starts (any position: our state continues any
split; the authors' layer always goes block by block)."""
TARGET = 1e-12


def ours(case: dict, seed: int, bias_span: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Our residual branch on the case's input, whole and in two calls, and the parameters in the authors' layout."""
    torch.manual_seed(seed)
    unit = GatedAttentionUnit(gau_config(case, bias_span=bias_span)).double().eval()
    randomize(unit, seed)
    x = torch.randn(case["batch"], case["seq_len"], case["d_model"], generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    split = case["split"]
    with torch.no_grad():
        whole = unit(x).x - x
        first = unit(x[:, :split])
        second = unit(x[:, split:], state=first.state)
    carried = torch.cat([first.x, second.x], dim=1) - x
    return {"x": x.numpy(), "whole": whole.numpy(), "carried": carried.numpy()}, authors_params(unit)


def difference(a: np.ndarray, b: np.ndarray) -> dict:
    """Largest absolute difference, and the same relative to the largest entry of ``b``."""
    err = float(np.abs(a - b).max())
    return {"max_abs": err, "max_rel": err / float(np.abs(b).max())}


def check_case(name: str, case: dict, *, src: Path, jax_python: str, seed: int, work: Path) -> dict:
    """One case: every comparison's differences."""
    mine, params = ours(case, seed, "block")
    window, _ = ours(case, seed, "window")
    dims = {k: case[k] for k in ("d_model", "d_k", "n_code", "block_len")} | {"max_wavelength": 1e5}
    io_in, io_out = work / f"{name}-in.npz", work / f"{name}-out.npz"
    np.savez(io_in, x=mine["x"], dims=json.dumps(dims), **{f"param:{k}": v for k, v in params.items()})
    run_jax_side(jax_python, "crosscheck.py", "--src", str(src), "--io", str(io_in), str(io_out))
    theirs = np.load(io_out)
    return {"case": name, **case, "seed": seed,
            "whole_vs_authors_whole": difference(mine["whole"], theirs["whole"]),
            "carried_vs_authors_blocks": difference(mine["carried"], theirs["blocks"]),
            "authors_whole_vs_authors_blocks": difference(theirs["whole"], theirs["blocks"]),
            "window_span_vs_authors_whole": difference(window["whole"], theirs["whole"])}


def table(result: dict) -> str:
    """The markdown report: one row per case."""
    lines = [f"### Our layer (bias_span 'block') vs the authors' JAX layer, float64 (target {TARGET:g})", "",
             "| case | D_m | D_k | S | L | T | B | split | whole vs authors (abs / rel) | two calls vs authors' "
             "blocks (abs / rel) | authors whole vs blocks | span 'window' vs authors |",
             "|---|" + "---:|" * 7 + "---:|---:|---:|---:|"]
    for r in result["rows"]:
        cells = [f"{r[k]['max_abs']:.1e} / {r[k]['max_rel']:.1e}" for k in
                 ("whole_vs_authors_whole", "carried_vs_authors_blocks", "authors_whole_vs_authors_blocks",
                  "window_span_vs_authors_whole")]
        lines.append(f"| {r['case']} | {r['d_model']} | {r['d_k']} | {r['n_code']} | {r['block_len']} | "
                     f"{r['seq_len']} | {r['batch']} | {r['split']} | " + " | ".join(cells) + " |")
    verdict = "met" if result["met"] else "MISSED"
    lines += ["", f"Target (largest absolute difference of ours vs the authors' below {TARGET:g}): **{verdict}**.",
              f"Authors' code: branch `{result['authors_branch']}` at `{result['authors_commit']}`; ours at "
              f"`{result['machine']['commit']}`.", "", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_authors_flags(parser)
    parser.add_argument("--case", nargs="+", default=["small", "odd-split"], choices=list(CASES))
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--out", type=not_empty, default=None, help="write OUT.json and OUT.md (default: print only)")
    args = parser.parse_args(argv)
    require_authors(args)
    with tempfile.TemporaryDirectory() as tmp:
        src, commit = authors_source(args.authors, Path(tmp) / "authors")
        rows = [check_case(name, CASES[name], src=src, jax_python=args.jax_python, seed=args.seed, work=Path(tmp))
                for name in args.case]
    met = all(r[k]["max_abs"] < TARGET for r in rows for k in ("whole_vs_authors_whole", "carried_vs_authors_blocks"))
    result = {"benchmark": "authors-crosscheck", "rows": rows, "met": met, "target": TARGET,
              "authors_branch": "optimized", "authors_commit": commit, "command": command_line(),
              "machine": machine_info(measure_peak=False)}
    print(table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(table(result))
    return result


if __name__ == "__main__":
    main()
