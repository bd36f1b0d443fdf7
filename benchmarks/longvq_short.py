"""Where a LongVQ classifier's training step goes on short sequences, and what the two short-sequence paths save.

Three timings, each pair interleaved call by call (so that the others' load falls on both alike), median of
``--repeats`` after ``--warmup``, fwd+bwd:

* ``attention``: the encoder VQ operator at ``T <= 2L``, its dense path (what ``vq_bidir_attention`` takes there)
  against the window path (what it takes at ``T > 2L``, and took at every length before); the two outputs are
  checked to agree before any timing;
* ``ema``: the bidirectional EMA as one two-sided FFT convolution (``ema_bidir_conv``) against two causal ones, the
  second on the reversed sequence (the form before);
* ``step``: one optimizer step of the LongVQ classifier against the Transformer baseline, each at its defaults for
  the dataset (``classify_config`` without a preset: LongVQ takes the dataset's recipe), on random tokens.

Writes ``OUT.json`` and ``OUT.md`` with the machine, commit, versions and the others' load::

    python benchmarks/longvq_short.py --out benchmarks/results/longvq-short-profile-2026-11-26
    python benchmarks/longvq_short.py --length 784 --batch 32 --data fashion-mnist --skip attention --out ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from transformer_vq.bench.load import OthersLoad, load_text
from transformer_vq.bench.machine import machine_info
from transformer_vq.bench.result import command_line
from transformer_vq.config import classify_config
from transformer_vq.config.flags import int_at_least, not_empty
from transformer_vq.models.longvq.ssm import DampedEMA
from transformer_vq.ops.ema.conv import ema_bidir_conv, ema_kernel, fft_conv
from transformer_vq.ops.vq_bidir import vq_bidir_attention
from transformer_vq.ops.vq_bidir import attention as vq_bidir_module
from transformer_vq.train.classify.build import build_classifier


def paired(calls: dict, warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds of each callable, the callables interleaved."""
    times = {name: [] for name in calls}
    for i in range(warmup + repeats):
        for name, call in calls.items():
            begin = time.perf_counter()
            call()
            if i >= warmup:
                times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(t) for name, t in times.items()}


def window_path(q, k_hat, v, bias, L, z, codebook, real):
    """``[B, H, T, Dv]``: the window path of ``vq_bidir_attention`` (what it takes at ``T > 2L``: the window scored
    exactly, every other key through its code) at any ``T``. The public function takes the dense path at ``T <= 2L``,
    so this one calls the path by its private name, every argument by keyword (a call by position, one argument
    short, once ran with each argument one slot off): a renamed or reshaped path fails here by name, in the smoke
    test that runs this script (tests/bench/test_longvq_short.py), and a wrong answer in :func:`attention_calls`."""
    return vq_bidir_module._attend_window(q=q, k_hat=k_hat, v=v, bias=bias, L=L, z=z, codebook=codebook,
                                          code_scores=None, real=real, scoring="softmax")


def attention_calls(B, T, L, S, Dk, Dv):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, 1, T, Dk, generator=gen).requires_grad_()
    codebook = torch.randn(1, S, Dk, generator=gen)
    z = torch.randint(0, S, (B, 1, T), generator=gen)
    k_hat = codebook[0][z].requires_grad_()
    v = torch.randn(B, 1, T, Dv, generator=gen).requires_grad_()
    # a learned local bias's scale (it starts at zero): within the window path's correction limit, as at T > 2L
    bias = (0.5 * torch.randn(B, 1, T, 3 * L, generator=gen)).requires_grad_()
    real = torch.ones(B, T, dtype=torch.bool)

    def dense_out():
        return vq_bidir_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook, mask=real)[0]

    def window_out():
        return window_path(q, k_hat, v, bias, L, z, codebook, real)

    # the same attention by both paths (exact in float64: tests/ops/vq_bidir), or the timings compare nothing
    torch.testing.assert_close(window_out().detach(), dense_out().detach(), rtol=1e-4, atol=1e-5)
    return {"dense path (now)": lambda: dense_out().sum().backward(),
            "window path (before)": lambda: window_out().sum().backward()}


def ema_calls(B, T, D, N):
    ssm = DampedEMA(D, N, bidirectional=True)
    x = torch.randn(B, T, D).requires_grad_()

    def one_fft():
        ema_bidir_conv(x, ssm.coefficients(0), ssm.coefficients(1)).sum().backward()

    def two_ffts():  # the form before: a causal convolution each way, the backward one on the reversed sequence
        forward, backward = ssm.coefficients(0), ssm.coefficients(1)
        later = fft_conv(x.flip(1), ema_kernel(backward, T)).flip(1)
        (fft_conv(x, ema_kernel(forward, T)) + later).sum().backward()

    return {"one FFT (now)": one_fft, "two FFTs (before)": two_ffts}


def step_calls(B, T, data):
    calls = {}
    for arch in ("longvq", "transformer"):
        cfg = classify_config(n_classes=10, vocab_size=256, train={"data": data, "arch": arch})
        model = build_classifier(cfg).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(0)
        ids, labels = torch.randint(0, 256, (B, T), generator=gen), torch.randint(0, 10, (B,), generator=gen)
        mask = torch.ones(B, T, dtype=torch.bool)

        def step(model=model, optimizer=optimizer, ids=ids, labels=labels, mask=mask):
            model(ids, mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if hasattr(model, "update_codebooks"):
                model.update_codebooks()

        calls[f"{arch} step"] = step
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=not_empty, required=True, help="output path without extension")
    parser.add_argument("--data", type=not_empty, default="digits",
                        help="the dataset whose defaults the step timing takes")
    parser.add_argument("--batch", type=int_at_least(1), default=32)
    parser.add_argument("--length", type=int_at_least(1), default=64)
    parser.add_argument("--block-len", type=int_at_least(1), default=32)
    parser.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed calls first (0 = none)")
    parser.add_argument("--repeats", type=int_at_least(1), default=30)
    parser.add_argument("--skip", nargs="*", default=[], choices=["attention", "ema", "step"])
    args = parser.parse_args(argv)
    B, T, L = args.batch, args.length, args.block_len
    # the small preset's sizes: d_model 64, d_qk 32, d_v 128, 64 codes, EMA dimension 8
    groups = {"attention": lambda: attention_calls(B, T, L, 64, 32, 128), "ema": lambda: ema_calls(B, T, 64, 8),
              "step": lambda: step_calls(B, T, args.data)}
    results, lines = {}, []
    with OthersLoad() as load:
        for name, make in groups.items():
            if name in args.skip:
                continue
            medians = paired(make(), args.warmup, args.repeats)
            (now, a), (before, b) = medians.items()
            results[name] = {"medians_s": medians, "ratio": b / a}
            lines.append(f"| {name} | {now} {a * 1e3:.2f} ms | {before} {b * 1e3:.2f} ms | {b / a:.2f}x |")
            print(lines[-1], flush=True)
    summary = load.summary()
    print(load_text(summary))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine_info(measure_peak=False), "torch_threads": torch.get_num_threads(),
              "shape": {"B": B, "T": T, "L": L}, "data": args.data, "warmup": args.warmup, "repeats": args.repeats,
              "others_load": summary, "results": results, "command": command_line()}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    table = ["| what (fwd+bwd) | first | second | second / first |", "|---|---|---|---|", *lines]
    out.with_suffix(".md").write_text(f"B {B}, T {T}, L {L}, defaults of {args.data}; medians of {args.repeats} "
                                      f"interleaved calls; {load_text(summary)}\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
