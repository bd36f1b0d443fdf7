"""Batch-norm statistics re-estimated from the current weights (transformer_vq/nn/batch_stats.py): the running
statistics become the average over the given batches of their real tokens' statistics, nothing else in the model
changes, and a batch-normed classifier trained at a high learning rate scores in evaluation mode what it scores with
its batches' own statistics, which its lagging running averages did not (the defect this fixes)."""

from __future__ import annotations

import torch

from transformer_vq.config import longvq_preset
from transformer_vq.models.longvq.model import LongVQClassifier
from transformer_vq.nn.batch_stats import batch_norms, recompute_batch_norm_stats


def classifier(**fields) -> LongVQClassifier:
    torch.manual_seed(0)
    cfg = longvq_preset("tiny", n_classes=2, causal=False, norm="batch", **fields)
    return LongVQClassifier(cfg).double()


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of 3 sequences of 16 tokens, the last sequence of each padded after 10 tokens."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[-1, 10:] = False
    return [(torch.randint(0, 256, (3, 16), generator=g), mask) for _ in range(n)]


def test_statistics_are_the_batches_average_over_real_tokens_and_nothing_else_changes():
    model = classifier(dropout=0.5).train()
    norms = batch_norms(model)
    assert len(norms) == 2 * model.cfg.n_layers
    seen = {norm: [] for norm in norms}
    hooks = [norm.register_forward_pre_hook(lambda m, args: seen[m].append(args[0].detach())) for norm in norms]
    codebooks = [t.clone() for t in model.codebook_stats()]
    params = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "batches" not in k}
    used = recompute_batch_norm_stats(model, batches(2))
    for hook in hooks:
        hook.remove()
    assert used == 2
    for norm in norms:
        inputs = seen[norm]
        assert [x.shape[0] for x in inputs] == [3 * 16 - 6] * 2  # the real tokens only
        mean = torch.stack([x.mean(0) for x in inputs]).mean(0)
        var = torch.stack([x.var(0, unbiased=True) for x in inputs]).mean(0)
        torch.testing.assert_close(norm.running_mean, mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(norm.running_var, var, rtol=0, atol=1e-12)
        assert norm.momentum == 0.1
    assert all(m.training for m in model.modules())  # every mode restored
    assert all(torch.equal(a, b) for a, b in zip(codebooks, model.codebook_stats()))  # no codebook statistics
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in params.items())
    # dropout was off: the same call gives the same statistics
    first = [norm.running_mean.clone() for norm in norms]
    recompute_batch_norm_stats(model, batches(2))
    assert all(torch.equal(a, norm.running_mean) for a, norm in zip(first, norms))


def test_a_model_without_batch_norm_is_not_run():
    torch.manual_seed(0)
    model = LongVQClassifier(longvq_preset("tiny", n_classes=2, causal=False, norm="layer")).double()
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    assert recompute_batch_norm_stats(model, batches(2)) == 0 and not calls


def test_evaluation_after_recompute_scores_what_training_mode_scores():
    """Train a few steps at lr 3e-2 (Mega's image recipes take 1e-2 and more): the running averages lag the weights,
    so evaluation-mode logits on a training batch are far from the logits with the batch's own statistics. Once the
    statistics are taken from that batch with the current weights they agree to rounding (the variance made the
    biased one that training mode divides by; evaluation keeps the unbiased one)."""
    model = classifier(dropout=0.0)
    data = batches(6)
    labels = torch.tensor([0, 1, 1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    for ids, mask in data:
        optimizer.zero_grad()
        model(ids, mask=mask, labels=labels).loss.backward()
        optimizer.step()
    ids, mask = data[0]
    tokens = int(mask.sum())
    with torch.no_grad():
        own = model.train()(ids, mask=mask).logits
        lagging = model.eval()(ids, mask=mask).logits
        recompute_batch_norm_stats(model, [(ids, mask)])
        for norm in batch_norms(model):
            norm.running_var *= (tokens - 1) / tokens
        fresh = model.eval()(ids, mask=mask).logits
    torch.testing.assert_close(fresh, own, rtol=0, atol=1e-10)
    assert (lagging - own).abs().max() > 0.1  # the defect: without re-estimation evaluation is off
