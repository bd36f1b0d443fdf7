"""Context parallelism of the whole model over gloo ranks: each rank's logits are its chunk of the single process's,
the parameter gradients summed over ranks and the codebook statistics summed over ranks are the single process's,
over two training windows with the state carried (truncated backprop), as the trainer runs them."""

from __future__ import annotations

import pytest
import torch
from distutil import run_gloo

from transformer_vq import TransformerVQ, preset
from transformer_vq.nn.attend import attend

WINDOW, WINDOWS, BATCH = 32, 2, 2
VARIANTS = {
    "shga": dict(),
    "mha-abspos": dict(head_type="mha", n_head=2, d_v=64, abs_pos=True),
}


def model_and_ids(variant, dtype):
    torch.manual_seed(0)
    cfg = preset("tiny", n_layers=2, n_code=6, block_len=4, dropres=0.0, dropsin=0.0, **VARIANTS[variant])
    model = TransformerVQ(cfg).to(dtype).train()  # training mode: the quantizers accumulate their statistics
    with torch.no_grad():
        if model.abs_pos_scale is not None:
            model.abs_pos_scale.fill_(0.5)  # exercise the absolute positions of each chunk
        for unit in model.units:  # non-zero u, v_r so the position terms take part
            unit.u.normal_()
            unit.v_r.normal_()
    ids = torch.randint(0, 256, (BATCH, WINDOW * WINDOWS + 1), generator=torch.Generator().manual_seed(1))
    return model, ids


def train_windows(model, ids, rank=0, ranks=1, group=None):
    """Forward and backward of every window (the state detached between them), each rank on its chunk of each
    window with its loss divided by the number of ranks (the mean over the window is the mean of the chunk means)."""
    state, logits = None, []
    chunk = WINDOW // ranks
    for w in range(WINDOWS):
        lo = w * WINDOW + rank * chunk
        out = model(ids[:, lo:lo + chunk], state, targets=ids[:, lo + 1:lo + chunk + 1], context_parallel=group)
        (out.loss / ranks).backward()
        state, logits = out.state.detach(), logits + [out.logits.detach()]
    return {"logits": logits, "grads": {n: p.grad for n, p in model.named_parameters()},
            "stats": [t.clone() for t in model.codebook_stats()], "state": state}


def worker(rank, ranks, variant, dtype):
    model, ids = model_and_ids(variant, dtype)
    return train_windows(model, ids, rank, ranks, torch.distributed.group.WORLD)


@pytest.mark.parametrize("variant,ranks,dtype", [("shga", 2, torch.float64), ("mha-abspos", 4, torch.float64),
                                                 ("shga", 2, torch.float32)], ids=str)
def test_ranks_train_as_one_process(variant, ranks, dtype, tmp_path):
    results = run_gloo(worker, ranks, tmp_path, variant, dtype)
    want = train_windows(*model_and_ids(variant, dtype))
    # float64: the merges and sums run in another order (rounding only); float32: ~1e-7 relative per operation
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for w in range(WINDOWS):
        got = torch.cat([r["logits"][w] for r in results], dim=1)
        torch.testing.assert_close(got, want["logits"][w], rtol=tol, atol=tol, msg=lambda m: f"window {w}: {m}")
    for name, grad in want["grads"].items():
        total = sum(r["grads"][name] for r in results)
        torch.testing.assert_close(total, grad, rtol=tol, atol=tol, msg=lambda m: f"grad {name}: {m}")
    # the codebook statistics (EMA key sums and counts) are sums over keys: all-reduced over the ranks, as the trainer
    # does over every worker, they are the single process's, so the codebook update is too
    for i, stat in enumerate(want["stats"]):
        torch.testing.assert_close(sum(r["stats"][i] for r in results), stat, rtol=tol, atol=tol)
    for r in results:
        assert r["state"].offset == want["state"].offset == WINDOW * WINDOWS
        for mine, theirs in zip(r["state"].layers, want["state"].layers):
            torch.testing.assert_close(mine.cache_mean, theirs.cache_mean, rtol=tol, atol=tol)
            assert torch.equal(mine.cache_count, theirs.cache_count) and torch.equal(mine.recent_z, theirs.recent_z)


def test_other_attention_is_refused():
    cfg = preset("tiny", attn_type="full")
    x = torch.zeros(1, 1, 4, cfg.d_k)
    with pytest.raises(ValueError) as err:
        attend(cfg, x, x, x, torch.zeros(1, 1, 4, 2 * cfg.block_len), state=None, mask=None, attention="linear",
               context_parallel=object())  # refused before the group is used
    assert str(err.value) == "context parallelism needs attn_type 'vq', got 'full'"


CHUNKS = (8, 16, 8)  # unequal lengths, whole blocks each: the operator takes them, so the model must place them


def unequal_worker(rank, ranks):
    model, ids = model_and_ids("mha-abspos", torch.float64)
    lo = sum(CHUNKS[:rank])
    out = model.eval()(ids[:, lo:lo + CHUNKS[rank]], context_parallel=torch.distributed.group.WORLD)
    return {"logits": out.logits, "offset": out.state.offset}


def test_chunks_of_unequal_length_sit_where_the_ranks_lengths_say(tmp_path):
    """A rank's chunk begins after the lengths of the ranks before it, summed, and the state's offset is all of them:
    with absolute positions, rank r's chunk placed at r times its own length gave other logits (2.55 off)."""
    results = run_gloo(unequal_worker, len(CHUNKS), tmp_path)
    model, ids = model_and_ids("mha-abspos", torch.float64)
    want = model.eval()(ids[:, :sum(CHUNKS)])
    torch.testing.assert_close(torch.cat([r["logits"] for r in results], dim=1), want.logits, rtol=1e-12, atol=1e-12)
    assert [r["offset"] for r in results] == [want.state.offset] * len(CHUNKS) == [sum(CHUNKS)] * len(CHUNKS)


def refusing_worker(rank, ranks, case):
    model, ids = model_and_ids("shga", torch.float64)
    chunk = ids[:, rank * 8:(rank + 1) * 8].clone()
    mask = None
    if case == "padding" and rank == 0:
        mask = torch.ones_like(chunk, dtype=torch.bool)
        mask[:, -2:] = False  # trailing in rank 0's chunk, but rank 1's real tokens come after it
    if case == "ids" and rank == 1:
        chunk[0, 3] = 999
    try:
        model.eval()(chunk, mask=mask, context_parallel=torch.distributed.group.WORLD)
    except ValueError as err:
        return str(err)
    return "accepted"


@pytest.mark.parametrize("case", ["padding", "ids"])
def test_a_rank_that_refuses_its_input_makes_every_rank_raise(case, tmp_path):
    """What one rank refuses of its own chunk (padding, whose keys the later ranks would attend as real tokens; a
    bad id) is raised on every rank after the exchange, its reason on that rank: none is left waiting in a collective
    for a rank that stopped, and none goes on alone."""
    refuser = 0 if case == "padding" else 1
    results = run_gloo(refusing_worker, 2, tmp_path, case)
    assert results[1 - refuser] == f"rank {refuser} refused its input (that rank's own error says why)"
    reason = "context parallelism takes whole sequences without padding" if case == "padding" else "input_ids"
    assert results[refuser].startswith(f"rank {refuser}: ") and reason in results[refuser], results[refuser]


def layerdrop_worker(rank, ranks):
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, dropres=0.0, dropsin=0.0,
                                 droplyr=0.5)).double().train()
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(100 + rank)  # the ranks' random streams differ, as the trainer seeds them
    out = model(ids[:, rank * 8:(rank + 1) * 8], context_parallel=torch.distributed.group.WORLD)
    return {"logits": out.logits.detach()}


def test_layerdrop_decides_once_per_sequence_under_context_parallelism(tmp_path):
    """A unit dropped for a sequence is dropped for every chunk of it: the ranks take the first chunk's decision, so
    the chunks' logits are those of one process drawing as rank 0 draws (each rank drew its own: a sequence had a
    unit dropped in one half and kept in the other)."""
    results = run_gloo(layerdrop_worker, 2, tmp_path)
    torch.manual_seed(0)
    model = TransformerVQ(preset("tiny", n_layers=2, n_code=6, block_len=4, dropres=0.0, dropsin=0.0,
                                 droplyr=0.5)).double().train()
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(100)
    want = model(ids).logits.detach()
    torch.testing.assert_close(torch.cat([r["logits"] for r in results], dim=1), want, rtol=1e-12, atol=1e-12)
