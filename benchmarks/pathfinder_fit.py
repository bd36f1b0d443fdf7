"""Fit tests on Pathfinder (issue 22, item 2): can a classifier fit anything of the project's 32 x 32 Pathfinder
images in a few minutes of one core? Trains on the first ``--n-fit`` training images (many epochs when few, fresh
images when ``--n-fit`` is the whole split) with the true labels or a control label, and prints the training loss and
accuracy every ``--every`` steps and, every ``--eval-every``, the accuracy on those images and on the first
``--n-val`` validation images in evaluation mode, with each batch's own statistics ("batch-stat": a batch-normed
model's batches as in training) and with batch-norm statistics re-estimated from 8 training batches ("precise").

Labels (``--label``): ``true``; ``ink``, whether an image has more ink than the median (a global count: the input
path, pooling and head are working if it is learned); ``dist``, whether the two dots are less than 14 pixels apart
(a relation between two far tokens, which alone predicts the true label of 63% of the images).

``--arch cnn`` is a control, not a sequence model: a small convolutional network (8 convolutions of 3 x 3, batch
norm, two poolings, a global max) reading each image as the 32 x 32 grid it is. It tells whether the generator's
task is learnable at all in minutes here (it asks nothing beyond the image: contours may cross), and so how much
of the sequence models' failure is the raster order's: LRA's rules forbid that 2D view to the models it ranks.

``--tau-max T`` initializes the SSM's ``alpha`` at ``1 / tau``, ``tau`` log-uniform over ``[1.5, T]``, after the model's
own initialization: the formula that became ``LongVQConfig.ema_timescale`` (which draws it inside the model's init).

The runs and their results: benchmarks/results/classify-curve-pathfinder-2026-11-27.md, "Fit tests". A scratch
harness (its own loop, not the trainer): its numbers are what it prints, on one torch thread.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from types import SimpleNamespace

import numpy as np
import torch

from transformer_vq.config.flags import float_in, int_at_least, not_empty
from transformer_vq.config.longvq import CLASSIFY_PRESETS
from transformer_vq.data.classify.pathfinder import layout, load_pathfinder
from transformer_vq.models.baselines.classifiers import TransformerClassifier
from transformer_vq.models.longvq.model import LongVQClassifier
from transformer_vq.nn.batch_stats import recompute_batch_norm_stats


def tau_max(text: str) -> float:
    """``--tau-max``: 0 (off) or at least 1.5, the low end of the range ``tau`` is drawn from."""
    value = float_in(0, why="0 = off")(text)
    if 0 < value < 1.5:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or >= 1.5 (tau is drawn log-uniform in [1.5, tau_max]), "
                                         f"got {text!r}")
    return value


tau_max.bounds = {"min": 0.0, "max": None, "min_open": False, "max_open": False}  # its floor, as float_in keeps it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="longvq", choices=("longvq", "transformer", "cnn"),
                   help="cnn: the 2D control (see above)")
    p.add_argument("--n-fit", type=int_at_least(1), default=256)
    p.add_argument("--n-val", type=int_at_least(1), default=256)
    p.add_argument("--steps", type=int_at_least(1), default=100)
    p.add_argument("--batch", type=int_at_least(1), default=32)
    p.add_argument("--lr", type=float_in(0, low_open=True), default=1e-2)
    p.add_argument("--warmup", type=int_at_least(0), default=10, help="linear warmup steps (0 = none)")
    p.add_argument("--clip", type=float_in(0), default=1.0, help="gradient norm clip (0 = none)")
    p.add_argument("--wd", type=float_in(0), default=0.01, help="weight decay (0 = none)")
    p.add_argument("--every", type=int_at_least(1), default=10)
    p.add_argument("--eval-every", type=int_at_least(1), default=50)
    p.add_argument("--model", type=not_empty, default="{}", help="json overrides of the small preset")
    p.add_argument("--data", type=not_empty, default="{}", help="json data options")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--cosine", action="store_true")
    p.add_argument("--label", default="true", choices=("true", "ink", "dist"),
                   help="true | ink (ink count above median) | dist (dot distance < 14)")
    p.add_argument("--tau-max", type=tau_max, default=0.0,
                   help="EMA alpha = 1/tau, tau log-uniform in [1.5, tau_max] (0 = the model's own init)")
    return p.parse_args(argv)


class GridCNN(torch.nn.Module):
    """``--arch cnn``: the 2D control, with the classifiers' call (``model(ids, labels=)``: logits and losses)."""

    def __init__(self, side: int, n_classes: int = 2, width: int = 32):
        super().__init__()
        self.side = side

        def conv(c_in: int, c_out: int) -> list[torch.nn.Module]:
            return [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.BatchNorm2d(c_out), torch.nn.ReLU()]

        layers = conv(1, width) + sum((conv(width, width) for _ in range(5)), [])
        layers += [torch.nn.MaxPool2d(2), *conv(width, 2 * width), torch.nn.MaxPool2d(2), *conv(2 * width, 2 * width)]
        self.body = torch.nn.Sequential(*layers, torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(2 * width, n_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None, mask=None) -> SimpleNamespace:
        """Logits of ``ids`` ``[B, side * side]`` (``mask``: all real here, as batch-norm re-estimation passes it)."""
        pixels = ids.view(-1, 1, self.side, self.side).float() / 255
        logits = self.head(self.body(pixels))
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return SimpleNamespace(logits=logits, loss=loss, ce_loss=loss)

    def update_codebooks(self) -> None:
        """No codebooks (the harness calls it after every step)."""


def long_memory_init(model: torch.nn.Module, tau_max: float) -> None:
    """Every SSM's ``alpha`` set to ``1 / tau``, ``tau`` log-uniform over ``[1.5, tau_max]`` (stored as its logit)."""
    for module in model.modules():
        if module.__class__.__name__ == "DampedEMA":
            with torch.no_grad():
                tau = torch.exp(torch.empty_like(module.alpha).uniform_(math.log(1.5), math.log(tau_max)))
                alpha = 1.0 / tau
                module.alpha.copy_(torch.log(alpha) - torch.log1p(-alpha))


def images(split, n: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` images of ``split`` as ``[n, side * side]`` token ids, and their labels."""
    x = torch.from_numpy(np.asarray(split.tokens[:n * side * side]).astype(np.int64)).view(n, -1)
    return x, torch.from_numpy(np.array(split.labels[:n], dtype=np.int64))


def near_dots(split_id: int, n: int) -> torch.Tensor:
    """Whether the two dots of each of the first ``n`` images of a split (the default drawing, image i drawn from
    the seed (0, split, i)) are less than 14 pixels apart."""
    dots = (layout(np.random.default_rng([0, split_id, i]), 32, 8, 4, 0.35)[2] for i in range(n))
    return torch.tensor([int(np.linalg.norm(d[0] - d[1]) < 14) for d in dots])


def control_labels(label: str, x: torch.Tensor, y: torch.Tensor, xv: torch.Tensor, yv: torch.Tensor):
    """The labels a fit test trains on: the true ones, or a control (see the module docstring)."""
    if label == "ink":
        median = (x > 0).sum(1).median()
        return ((x > 0).sum(1) > median).long(), ((xv > 0).sum(1) > median).long()
    if label == "dist":
        return near_dots(0, len(x)), near_dots(1, len(xv))
    return y, yv


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_stats: bool = False):
    """Accuracy and cross-entropy on ``(x, y)``: in evaluation mode, or (``batch_stats``) a copy of the model in
    training mode, each batch normalized by its own statistics."""
    m = copy.deepcopy(model) if batch_stats else model
    m.train(batch_stats)
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), 64):
            out = m(x[i:i + 64], labels=y[i:i + 64])
            correct += (out.logits.argmax(-1) == y[i:i + 64]).sum().item()
            loss += out.ce_loss.item() * len(y[i:i + 64])
    model.train()
    return correct / len(x), loss / len(x)


def precise(model: torch.nn.Module, x: torch.Tensor, batch: int, n_batches: int = 8) -> torch.nn.Module:
    """A copy of ``model`` whose batch-norm statistics are re-estimated from the first ``n_batches`` batches of
    ``x`` (:func:`~transformer_vq.nn.batch_stats.recompute_batch_norm_stats`, as the trainer does)."""
    m = copy.deepcopy(model)
    n_batches = min(n_batches, math.ceil(len(x) / batch))  # fewer when there are fewer images
    recompute_batch_norm_stats(m, ((x[i * batch:(i + 1) * batch], None) for i in range(n_batches)))
    return m


def lr_factor(a: argparse.Namespace, step: int) -> float:
    if step < a.warmup:
        return (step + 1) / a.warmup
    if not a.cosine:
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - a.warmup) / max(1, a.steps - a.warmup)))


def report(a, model, norm: str, step: int, x, fit, val, t0: float) -> None:
    """The evaluations of one ``--eval-every``: on the first fitted images, on validation (evaluation mode, batch
    statistics and, for batch norm, statistics re-estimated from the first batches of ``x``)."""
    fa, fl = evaluate(model, *fit)
    vaa, vl = evaluate(model, *val)
    bsa, bsl = evaluate(model, *val, batch_stats=True) if norm == "batch" else (vaa, vl)
    if norm == "batch":
        pa, pl = evaluate(precise(model, x, a.batch), *val)
        print(f"  precise-BN val acc {pa:.3f} loss {pl:.4f}")
    print(f"  eval step {step}: fit acc {fa:.3f} loss {fl:.4f} | val acc {vaa:.3f} loss {vl:.4f} | "
          f"val batch-stat acc {bsa:.3f} loss {bsl:.4f} t {time.time() - t0:.0f}s", flush=True)


def fit(a, model, norm: str, x, y, xv, yv) -> None:
    """``--steps`` AdamW steps on ``(x, y)`` (epochs reshuffled), printing the running loss and the evaluations."""
    decay = [q for q in model.parameters() if q.ndim > 1]
    no_decay = [q for q in model.parameters() if q.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0}],
                            lr=a.lr, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(a.seed)
    perm, pos, t0 = torch.randperm(len(x), generator=g), 0, time.time()
    run_loss, run_acc, run_n = 0.0, 0.0, 0
    for s in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = a.lr * lr_factor(a, s)
        if pos + a.batch > len(x):
            perm, pos = torch.randperm(len(x), generator=g), 0
        idx = perm[pos:pos + a.batch]
        pos += a.batch
        out = model(x[idx], labels=y[idx])
        opt.zero_grad()
        out.loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip if a.clip > 0 else 1e9)
        opt.step()
        model.update_codebooks()
        run_loss += out.ce_loss.item()
        run_acc += (out.logits.argmax(-1) == y[idx]).float().mean().item()
        run_n += 1
        if (s + 1) % a.every == 0:
            print(f"step {s + 1} loss {run_loss / run_n:.4f} acc {run_acc / run_n:.3f} gn {gn:.3f} "
                  f"t {time.time() - t0:.0f}s", flush=True)
            run_loss, run_acc, run_n = 0.0, 0.0, 0
        if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
            report(a, model, norm, s + 1, x, (x[:256], y[:256]), (xv, yv), t0)


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    data_options = {**dict(n_train=20000, n_validation=500, n_test=2000), **json.loads(a.data)}
    data = load_pathfinder(**data_options)
    cfg = CLASSIFY_PRESETS["small"].replace(**{**dict(norm="batch", dropout=0.0, causal=False, n_classes=2,
                                                      vocab_size=256), **json.loads(a.model)})
    side = data_options.get("side", 32)
    if a.arch == "cnn":
        model = GridCNN(side)
    else:
        model = (LongVQClassifier if a.arch == "longvq" else TransformerClassifier)(cfg)
    if a.tau_max > 0:
        long_memory_init(model, a.tau_max)
    print("params", sum(p.numel() for p in model.parameters()), model if a.arch == "cnn" else cfg, flush=True)
    train, validation = data.split("train"), data.split("validation")
    x, y = images(train, min(a.n_fit, len(train)), side)
    xv, yv = images(validation, min(a.n_val, len(validation)), side)
    y, yv = control_labels(a.label, x, y, xv, yv)
    print("fit label mean", y.float().mean().item(), "val label mean", yv.float().mean().item())
    fit(a, model, "batch" if a.arch == "cnn" else cfg.norm, x, y, xv, yv)


if __name__ == "__main__":
    main()
