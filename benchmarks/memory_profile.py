"""Where the bytes of one whole layer go at long sequences: the tensors autograd saves for backward, the ops that
allocate the most, and the peak RSS of the forward and of forward + backward (issue 23).

    python benchmarks/memory_profile.py [--length 32k] [--out benchmarks/results] [--name NAME]

The layer of benchmarks/jax_layer.py (one gated attention unit, D_m 768, D_k 128, D_v 1536, S 512, L 512, float32,
batch 1, ``bias_span="block"``, evaluation mode, the default serial reduction):

- **saved for backward**: every tensor the forward hands to autograd (``torch.autograd.graph.saved_tensors_hooks``),
  with its shape, dtype, the bytes of its storage (a storage saved twice, or viewed by several saved tensors, counts
  once), the op whose output it is (``grad_fn``; none for inputs and parameters) and the line of this project that
  created the op which saved it. Their sum is what the graph holds between forward and backward.
- **per op**: ``torch.profiler`` with ``profile_memory``: the ops whose own allocations are largest, forward and
  forward + backward.
- **peaks**: the process's RSS high-water mark (transformer_vq/bench/memory.py) over a forward without autograd and
  over a forward + backward (the backward of the sum of the output, to every parameter and the input, as
  jax_layer.py's ``fwdbwd``), each after one warm-up call; and its rise above the RSS before the call.

Writes ``NAME.json`` and ``NAME.md`` under ``--out`` with the machine, commit and versions.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections import defaultdict
from pathlib import Path

import torch
from authors_bridge import gau_config, randomize
from jax_layer import layer_length
from layer_worker import layer_calls
from result_files import write_result

from transformer_vq import GatedAttentionUnit
from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.memory import PeakMemory
from transformer_vq.config import PRESETS
from transformer_vq.config.flags import file_stem, int_at_least, not_empty

GIB = 2**30
PACKAGE = str(Path(__file__).resolve().parents[1] / "transformer_vq")


def build(length: int, seed: int = 0) -> tuple[GatedAttentionUnit, torch.Tensor]:
    """The layer of benchmarks/jax_layer.py and an input ``[1, T, D_m]``."""
    dims = {k: getattr(PRESETS["enwik8"], k) for k in ("d_model", "d_k", "n_code", "block_len", "max_wavelength")}
    torch.manual_seed(seed)
    unit = GatedAttentionUnit(gau_config(dims, bias_span="block")).eval()
    randomize(unit, seed)
    x = torch.randn(1, length, dims["d_model"], generator=torch.Generator().manual_seed(seed))
    return unit, x


def _site() -> str:
    """The innermost line of this project on the stack: where the op that saves a tensor was called."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(PACKAGE):
            return f"{frame.filename[len(PACKAGE) - len('transformer_vq'):]}:{frame.lineno} {frame.name}"
    return "?"


def saved_for_backward(unit: GatedAttentionUnit, x: torch.Tensor) -> dict:
    """The tensors one forward with autograd saves for backward, grouped by where they were saved."""
    params = {p.untyped_storage().data_ptr() for p in unit.parameters()}
    seen, rows = set(), []

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        kind = "parameter" if key in params else ("input" if key == x.untyped_storage().data_ptr() else "activation")
        rows.append({"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                     "bytes": 0 if key in seen else storage.nbytes(), "kind": kind, "site": _site(),
                     "made_by": type(t.grad_fn).__name__ if t.grad_fn is not None else "-"})
        seen.add(key)
        return t

    y = x.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = unit(y).x
    del out
    by_site = defaultdict(lambda: {"bytes": 0, "tensors": 0, "shapes": []})
    for r in rows:
        entry = by_site[(r["site"], r["kind"])]
        entry["bytes"] += r["bytes"]
        entry["tensors"] += 1
        entry["shapes"].append(f"{r['made_by']} {r['dtype']}{r['shape']}")
    sites = [{"site": site, "kind": kind, **v} for (site, kind), v in by_site.items()]
    sites.sort(key=lambda s: -s["bytes"])
    activations = sum(r["bytes"] for r in rows if r["kind"] == "activation")
    return {"tensors": rows, "sites": sites, "activation_bytes": activations}


def peaks(unit: GatedAttentionUnit, x: torch.Tensor) -> dict:
    """Each mode's peak RSS over one call, after a warm-up call."""
    out = {}
    for mode, call in layer_calls(unit, x).items():
        call()
        with PeakMemory() as peak:
            call()
        out[mode] = peak.figures()
    return out


def per_op(unit: GatedAttentionUnit, x: torch.Tensor, top: int) -> dict:
    """The ``top`` ops by their own allocated bytes (``self_cpu_memory_usage``), per mode."""
    out = {}
    for mode, call in layer_calls(unit, x).items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True) as prof:
            call()
        events = [e for e in prof.key_averages(group_by_input_shape=True) if e.self_cpu_memory_usage > 0]
        events.sort(key=lambda e: -e.self_cpu_memory_usage)
        out[mode] = [{"op": e.key, "shapes": str(e.input_shapes)[:120], "calls": e.count,
                      "allocated_bytes": e.self_cpu_memory_usage, "cpu_s": e.cpu_time_total / 1e6}
                     for e in events[:top]]
    return out


def table(result: dict) -> str:
    """The markdown report."""
    saved, p = result["saved"], result["peaks"]
    lines = [f"### Memory of one whole layer at T = {result['T']} (D_m 768, D_k 128, D_v 1536, S 512, L 512, fp32, "
             "batch 1, eval mode, serial reduction)", "",
             "| mode | peak RSS | rise over the call |", "|---|---:|---:|"]
    lines += [f"| {mode} | {f['peak_rss_bytes'] / GIB:.2f} GiB | {f['peak_rss_rise_bytes'] / GIB:.2f} GiB |"
              for mode, f in p.items()]
    lines += ["", f"Saved for backward: {saved['activation_bytes'] / GIB:.2f} GiB of activations (parameters and the "
                  "input are not counted), by where the op that saved them was called:", "",
              "| GiB | tensors | kind | site | saved (op that made it, dtype, shape) |", "|---:|---:|---|---|---|"]
    for s in saved["sites"]:
        if s["kind"] != "activation" or s["bytes"] < 2**20:
            continue
        shapes = "; ".join(sorted(set(s["shapes"])))[:160]
        lines.append(f"| {s['bytes'] / GIB:.3f} | {s['tensors']} | {s['kind']} | `{s['site']}` | {shapes} |")
    for mode, ops in result["per_op"].items():
        lines += ["", f"Largest allocations by op, {mode} (torch.profiler, self allocated bytes, all calls):", "",
                  "| op | calls | GiB allocated | input shapes |", "|---|---:|---:|---|"]
        lines += [f"| {o['op']} | {o['calls']} | {o['allocated_bytes'] / GIB:.2f} | {o['shapes']} |" for o in ops]
    m = result["machine"]
    lines += ["", f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads; torch "
                  f"{m['torch']}; commit {m['commit']}{' (dirty)' if m['dirty'] else ''}; {m['date_utc']}; "
                  f"{load_text(result['others_load'])}.", "", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=layer_length, default=32768,
                        help="sequence length, 8k = 8192 (default: 32k)")
    parser.add_argument("--top", type=int_at_least(1), default=12, help="ops listed per mode")
    parser.add_argument("--out", type=not_empty, default="benchmarks/results")
    parser.add_argument("--name", type=file_stem, default=None, help="default: memory-profile-T-DATE")
    args = parser.parse_args(argv)
    length = args.length
    machine = machine_info(measure_peak=False)
    unit, x = build(length)
    with OthersLoad() as load:
        result = {"benchmark": "memory-profile", "T": length, "peaks": peaks(unit, x),
                  "saved": saved_for_backward(unit, x), "per_op": per_op(unit, x, args.top)}
    result.update(machine=machine, others_load=load.summary(),
                  command="python benchmarks/memory_profile.py " + " ".join(argv or []))
    write_result(result, table(result), args.out,
                 args.name or f"memory-profile-{length // 1024}k-{machine['date_utc'][:10]}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
