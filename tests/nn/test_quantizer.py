"""VectorQuantizer: nearest codes, straight-through gradient, EMA k-means in closed form, masking."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from transformer_vq import VectorQuantizer


def quantizer(G=1, S=3, D=2, **kwargs):
    vq = VectorQuantizer(G, S, D, **kwargs)
    with torch.no_grad():
        vq.ema_sum.copy_(torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]]).expand(G, S, D) if S == 3 else vq.ema_sum)
    return vq


def test_codes_are_nearest_codewords():
    torch.manual_seed(0)
    vq = VectorQuantizer(2, 16, 8).eval()
    k = torch.randn(3, 2, 40, 8)
    out = vq(k)
    dist = ((k.unsqueeze(-2) - vq.codebook[None, :, None]) ** 2).sum(-1)  # (B, G, T, S), brute force
    assert torch.equal(out.z, dist.argmin(-1))
    torch.testing.assert_close(out.k_hat, vq.codebook[torch.arange(2)[None, :, None], out.z])


def test_straight_through_gradient_reaches_keys():
    vq = quantizer().eval()
    k = torch.randn(2, 1, 5, 2, requires_grad=True)
    weight = torch.randn(2, 1, 5, 2)
    (grad,) = torch.autograd.grad((vq(k).k_hat * weight).sum(), k)
    torch.testing.assert_close(grad, weight)  # identity Jacobian (Remark 2.7)


def test_commit_loss_is_mean_squared_distance():
    vq = quantizer().eval()
    k = torch.tensor([[[[0.1, 0.0], [0.9, 0.3], [0.0, 1.5]]]])  # nearest: codes 0, 1, 2
    out = vq(k)
    assert out.z.tolist() == [[[0, 1, 2]]]
    expected = (0.1 ** 2 + (0.1 ** 2 + 0.3 ** 2) + 0.5 ** 2) / 3
    assert math.isclose(out.commit_loss.item(), expected, rel_tol=1e-6)
    (grad,) = torch.autograd.grad(vq(k.requires_grad_(True)).commit_loss, k)
    torch.testing.assert_close(grad, 2 * (k - out.k_hat) / 3)  # the codebook side is stop-gradient


def test_ema_update_closed_form():
    """Two keys on code 1, none on codes 0 and 2, gamma = 0.9: sum and count follow the EMA exactly."""
    vq = quantizer(ema_rate=0.9).train()
    keys = torch.tensor([[[[1.2, 0.2], [0.8, -0.4]]]])
    vq(keys)
    assert vq.acc_count.tolist() == [[0.0, 2.0, 0.0]]
    vq.update()
    # count_1 = 0.9 * 1 + 0.1 * 2 = 1.1; sum_1 = 0.9 * (1, 0) + 0.1 * (2.0, -0.2) = (1.1, -0.02)
    torch.testing.assert_close(vq.ema_count, torch.tensor([[0.9, 1.1, 0.9]]))
    torch.testing.assert_close(vq.ema_sum[0, 1], torch.tensor([1.1, -0.02]))
    torch.testing.assert_close(vq.codebook[0, 1], torch.tensor([1.1, -0.02]) / 1.1)
    assert vq.acc_count.sum() == 0 and vq.acc_sum.abs().sum() == 0  # statistics cleared


def test_unused_codes_decay():
    vq = quantizer(ema_rate=0.9).train()
    before = vq.codebook.clone()
    for _ in range(5):
        vq(torch.tensor([[[[1.0, 0.1]]]]))  # always code 1
        vq.update()
    torch.testing.assert_close(vq.ema_count[0, [0, 2]], torch.full((2,), 0.9 ** 5))
    torch.testing.assert_close(vq.codebook[0, [0, 2]], before[0, [0, 2]])  # sum and count decay together
    assert vq.updates_unused[0].tolist() == [5.0, 0.0, 5.0]


def test_padded_keys_change_nothing():
    torch.manual_seed(0)
    real = torch.randn(2, 1, 6, 2)
    padded = torch.cat([real, 100 * torch.randn(2, 1, 4, 2)], dim=2)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, :6] = True
    a, b = quantizer().train(), quantizer().train()
    out_a, out_b = a(real), b(padded, mask)
    torch.testing.assert_close(out_a.commit_loss, out_b.commit_loss)
    a.update(), b.update()
    torch.testing.assert_close(a.ema_sum, b.ema_sum)
    torch.testing.assert_close(a.ema_count, b.ema_count)


def test_eval_mode_accumulates_nothing():
    vq = quantizer().eval()
    vq(torch.randn(1, 1, 5, 2))
    assert vq.acc_count.sum() == 0


def test_stats_are_summable_across_workers():
    """Summing two workers' statistics, then updating, equals one worker seeing both batches."""
    torch.manual_seed(0)
    k1, k2 = torch.randn(1, 1, 7, 2), torch.randn(1, 1, 5, 2)
    w1, w2, single = quantizer().train(), quantizer().train(), quantizer().train()
    w1(k1), w2(k2), single(torch.cat([k1, k2], dim=2))
    for a, b in zip(w1.stats(), w2.stats()):
        a.add_(b)  # what all_reduce(SUM) does
    w1.update(), single.update()
    torch.testing.assert_close(w1.ema_sum, single.ema_sum)
    torch.testing.assert_close(w1.ema_count, single.ema_count)


def test_dead_code_restart_reseeds_from_recent_keys():
    torch.manual_seed(0)
    vq = quantizer(dead_code_restart=2).train()
    keys = torch.tensor([[[[1.0, 0.1], [0.9, -0.1]]]])  # code 1 only; codes 0 and 2 die
    for _ in range(2):
        vq(keys)
        vq.update()
    for code in (0, 2):
        assert any(torch.allclose(vq.codebook[0, code], key) for key in keys[0, 0])
    assert vq.updates_unused[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("world_size", [2, 3])
def test_workers_restart_each_dead_code_with_one_real_key_from_the_slot_s_worker(world_size):
    """Under data or context parallelism each summed reservoir slot holds one worker's key (slot c: worker c mod N),
    so a dead code restarts at a key some worker saw, identical on every worker; averaged over the workers, it was the
    mean of N unrelated keys."""
    torch.manual_seed(0)
    S = 6
    first = quantizer(S=S, dead_code_restart=1).train()
    workers = [first] + [copy.deepcopy(first) for _ in range(world_size - 1)]  # replicas, as DDP's
    keys = [torch.randn(1, 1, 5, 2) * 0.1 + 5.0 + 10.0 * rank for rank in range(world_size)]  # far from every code
    for worker, k in zip(workers, keys):
        worker(k)
    summed = [torch.zeros_like(t) for t in workers[0].stats()]
    for rank, worker in enumerate(workers):
        for total, t in zip(summed, worker.stats(rank, world_size)):
            total.add_(t)  # what all_reduce(SUM) does
    for worker in workers:
        for mine, total in zip(worker.stats(), summed):
            mine.copy_(total)
        worker.update()
    codebook = workers[0].codebook
    assert all(torch.equal(worker.codebook, codebook) for worker in workers)
    dead = (summed[1][0] == 0).nonzero().flatten().tolist()  # the codes no key went to (acc_count summed)
    assert dead
    for code in dead:  # restarted at a key of its slot's worker, not at a mean over the workers
        assert any(torch.allclose(codebook[0, code], key) for key in keys[code % world_size][0, 0])


def test_restart_is_off_by_default():
    vq = quantizer().train()
    for _ in range(3):
        vq(torch.tensor([[[[1.0, 0.1]]]]))
        vq.update()
    torch.testing.assert_close(vq.codebook[0, 2], torch.tensor([0.0, 2.0]))


def test_usage_metrics():
    vq = quantizer().train()
    vq(torch.tensor([[[[0.0, 0.0], [1.0, 0.0]]]]))  # codes 0 and 1 once each, code 2 unused
    vq.update()
    metrics = vq.metrics()
    assert math.isclose(metrics["codebook_perplexity"], 2.0, rel_tol=1e-6)
    assert math.isclose(metrics["codebook_unused"], 1 / 3, rel_tol=1e-6)


def test_shortcodes_in_float32_under_bfloat16_inputs():
    vq = quantizer().eval()
    k = torch.tensor([[[[0.49, 0.0], [0.51, 0.0]]]])
    assert vq(k.bfloat16()).z.tolist() == vq(k).z.tolist() == [[[0, 1]]]


def test_the_commitment_loss_is_float32_at_least_and_float64_in_a_float64_model():
    """It was accumulated in float32 whatever the model's dtype: a float64 model's padded call then differed from its
    rows alone by ~1e-7 relative, where everything else agreed to ~1e-16."""
    from transformer_vq import TransformerVQ, preset
    from transformer_vq.config import longvq_preset
    from transformer_vq.models.longvq.model import LongVQLM

    ids = torch.randint(0, 200, (2, 16))
    for model in (TransformerVQ(preset("tiny")), LongVQLM(longvq_preset("tiny"))):
        assert model(ids, targets=ids).commit_loss.dtype == torch.float32
        out = model.double()(ids, targets=ids)
        assert out.commit_loss.dtype == out.loss.dtype == torch.float64


def test_sizes_given_as_numpy_or_0d_tensors_are_kept_as_python_numbers():
    """A numpy or 0-d torch ``n_code`` (and the other sizes) was stored as given, so that ``json.dumps`` of the
    quantizer's sizes failed; they are now Python ints (``operator.index``), ``ema_rate`` a Python float."""
    import json

    import numpy as np

    for wrap in (np.int64, np.int32, torch.tensor):
        vq = VectorQuantizer(wrap(2), wrap(8), wrap(4), dead_code_restart=wrap(3), ema_rate=np.float32(0.5))
        sizes = {"n_group": vq.n_group, "n_code": vq.n_code, "dim": vq.dim, "dead_code_restart": vq.dead_code_restart}
        assert {name: type(value) for name, value in sizes.items()} == dict.fromkeys(sizes, int)
        assert type(vq.ema_rate) is float and vq.ema_rate == 0.5
        assert json.loads(json.dumps({**sizes, "ema_rate": vq.ema_rate})) == {
            "n_group": 2, "n_code": 8, "dim": 4, "dead_code_restart": 3, "ema_rate": 0.5}
        assert tuple(vq.codebook.shape) == (2, 8, 4)
