"""Fit tests on Pathfinder (issue 22, item 2): can a classifier fit anything of the project's 32 x 32 Pathfinder
images in a few minutes of one core? Trains on the first ``--n-fit`` training images (many epochs when few, fresh
images when ``--n-fit`` is the whole split) with the true labels or a control label, and prints the training loss and
accuracy every ``--every`` steps and, every ``--eval-every``, the accuracy on those images and on the first
``--n-val`` validation images in evaluation mode, with each batch's own statistics ("batch-stat": a batch-normed
model's batches as in training) and with batch-norm statistics re-estimated from 8 training batches ("precise").

Labels (``--label``): ``true``; ``ink``, whether an image has more ink than the median (a global count: the input
path, pooling and head are working if it is learned); ``dist``, whether the two dots are less than 14 pixels apart
(a relation between two far tokens, which alone predicts the true label of 63% of the images).

``--tau-max T`` initializes the SSM's ``alpha`` at ``1 / tau``, ``tau`` log-uniform over ``[1.5, T]``, after the model's
own initialization: the formula that became ``LongVQConfig.ema_timescale`` (which draws it inside the model's init).

The runs and their results: benchmarks/results/classify-curve-pathfinder-2026-11-27.md, "Fit tests". A scratch
harness (its own loop, not the trainer): its numbers are what it prints, on one torch thread.
"""
import argparse
import json
import math
import time
import numpy as np
import torch

from transformer_vq.config.longvq import CLASSIFY_PRESETS
from transformer_vq.data.classify.pathfinder import load_pathfinder
from transformer_vq.models.longvq.model import LongVQClassifier
from transformer_vq.models.baselines.classifiers import TransformerClassifier

p = argparse.ArgumentParser()
p.add_argument("--arch", default="longvq")
p.add_argument("--n-fit", type=int, default=256)
p.add_argument("--n-val", type=int, default=256)
p.add_argument("--steps", type=int, default=100)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--lr", type=float, default=1e-2)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--wd", type=float, default=0.01)
p.add_argument("--every", type=int, default=10)
p.add_argument("--eval-every", type=int, default=50)
p.add_argument("--model", default="{}", help="json overrides of the small preset")
p.add_argument("--data", default="{}", help="json data options")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--cosine", action="store_true")
p.add_argument("--label", default="true", help="true | ink (ink count above median) | dist (dot distance < 14)")
p.add_argument("--tau-max", type=float, default=0.0, help="EMA alpha = 1/tau, tau log-uniform in [1.5, tau_max]")
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(a.seed)
dopts = dict(n_train=20000, n_validation=500, n_test=2000)
dopts.update(json.loads(a.data))
data = load_pathfinder(**dopts)
mo = dict(norm="batch", dropout=0.0, causal=False, n_classes=2, vocab_size=256)
mo.update(json.loads(a.model))
cfg = CLASSIFY_PRESETS["small"].replace(**mo)
model = (LongVQClassifier if a.arch == "longvq" else TransformerClassifier)(cfg)
if a.tau_max > 0:
    for mod in model.modules():
        if mod.__class__.__name__ == "DampedEMA":
            with torch.no_grad():
                tau = torch.exp(torch.empty_like(mod.alpha).uniform_(math.log(1.5), math.log(a.tau_max)))
                al = 1.0 / tau
                mod.alpha.copy_(torch.log(al) - torch.log1p(-al))
print("params", sum(p.numel() for p in model.parameters()), cfg, flush=True)
tr = data.split("train")
va = data.split("validation")
n_fit = min(a.n_fit, len(tr))
side = dopts.get("side", 32)
X = torch.from_numpy(np.asarray(tr.tokens[:n_fit * side * side]).astype(np.int64)).view(n_fit, -1)
Y = torch.from_numpy(np.asarray(tr.labels[:n_fit]))
nv = min(a.n_val, len(va))
XV = torch.from_numpy(np.asarray(va.tokens).astype(np.int64)).view(len(va), -1)[:nv]
YV = torch.from_numpy(np.asarray(va.labels))[:nv]
if a.label == "ink":
    median = (X > 0).sum(1).median()
    Y, YV = ((X > 0).sum(1) > median).long(), ((XV > 0).sum(1) > median).long()
elif a.label == "dist":
    from transformer_vq.data.classify.pathfinder import layout
    def near_dots(split_id, n):  # the default drawing's layouts, image i of a split from the seed (0, split, i)
        dots = (layout(np.random.default_rng([0, split_id, i]), 32, 8, 4, 0.35)[2] for i in range(n))
        return torch.tensor([int(np.linalg.norm(d[0] - d[1]) < 14) for d in dots])
    Y, YV = near_dots(0, n_fit), near_dots(1, nv)
print("fit label mean", Y.float().mean().item(), "val label mean", YV.float().mean().item())
decay = [q for q in model.parameters() if q.ndim > 1]
nod = [q for q in model.parameters() if q.ndim <= 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nod, "weight_decay": 0}], lr=a.lr,
                        betas=(0.9, 0.98), eps=1e-9)


def lr_at(s):
    if s < a.warmup:
        return (s + 1) / a.warmup
    if not a.cosine:
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (s - a.warmup) / max(1, a.steps - a.warmup)))


def precise_copy(n_batches=8):
    import copy
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.reset_running_stats(); mod.momentum = None
    m.train()
    with torch.no_grad():
        for i in range(n_batches):
            m(X[i * a.batch:(i + 1) * a.batch])
    return m


def evaluate(Xe, Ye, batch_stats=False, m=None):
    import copy
    if m is None:
        m = copy.deepcopy(model) if batch_stats else model
    m.train(batch_stats)
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(Xe), 64):
            out = m(Xe[i:i + 64], labels=Ye[i:i + 64])
            correct += (out.logits.argmax(-1) == Ye[i:i + 64]).sum().item()
            loss += out.ce_loss.item() * len(Ye[i:i + 64])
    model.train()
    return correct / len(Xe), loss / len(Xe)


g = torch.Generator().manual_seed(a.seed)
perm = torch.randperm(n_fit, generator=g)
pos = 0
t0 = time.time()
run_loss, run_acc, run_n = 0.0, 0.0, 0
for s in range(a.steps):
    for gr in opt.param_groups:
        gr["lr"] = a.lr * lr_at(s)
    if pos + a.batch > n_fit:
        perm = torch.randperm(n_fit, generator=g)
        pos = 0
    idx = perm[pos:pos + a.batch]
    pos += a.batch
    out = model(X[idx], labels=Y[idx])
    opt.zero_grad()
    out.loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip if a.clip > 0 else 1e9)
    opt.step()
    model.update_codebooks()
    run_loss += out.ce_loss.item(); run_acc += (out.logits.argmax(-1) == Y[idx]).float().mean().item(); run_n += 1
    if (s + 1) % a.every == 0:
        print(f"step {s+1} loss {run_loss/run_n:.4f} acc {run_acc/run_n:.3f} gn {gn:.3f} t {time.time()-t0:.0f}s",
              flush=True)
        run_loss, run_acc, run_n = 0.0, 0.0, 0
    if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
        fa, fl = evaluate(X[:256], Y[:256])
        vaa, vl = evaluate(XV, YV)
        bsa, bsl = evaluate(XV, YV, True) if cfg.norm == "batch" else (vaa, vl)
        if cfg.norm == "batch":
            pa, pl = evaluate(XV, YV, m=precise_copy())
            print(f"  precise-BN val acc {pa:.3f} loss {pl:.4f}")
        print(f"  eval step {s+1}: fit acc {fa:.3f} loss {fl:.4f} | val acc {vaa:.3f} loss {vl:.4f} | "
              f"val batch-stat acc {bsa:.3f} loss {bsl:.4f} t {time.time()-t0:.0f}s", flush=True)
