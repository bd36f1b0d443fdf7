"""A rank that refuses its own input (a chunk of no whole number of blocks, an option context parallelism does not
honour, a tensor or state the operator refuses) makes every rank raise an error naming that rank at once, rather than
raising alone while the others wait in the exchange until the process group's timeout (30 minutes by default). Two
gloo processes on CPU, in a group whose timeout is short, so that a rank left waiting fails the test in seconds
instead of hanging it."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from distutil import run_gloo
from opsutil import doc_start_mask, make_vq_inputs

from transformer_vq.ops.vq import vq_attention
from transformer_vq.ops.vq.context_parallel import OPTION_REFUSALS, vq_attention_context_parallel

B, H, G, L, S, CHUNK = 1, 2, 1, 4, 3, 8
TIMEOUT_S = 10  # a rank left waiting in a collective raises after this long
DOCS = {"doc_start": doc_start_mask([[0, 3]], CHUNK)}

# Per rank, (its chunk's length, its options): each call is refused on one rank or on both.
SCENARIOS = {
    "short-chunk-on-rank-1": [(CHUNK, {}), (CHUNK - 2, {})],
    "window-only-on-rank-0": [(CHUNK, {"compressive_cache": False}), (CHUNK, {})],
    "doc_start-on-rank-1": [(CHUNK, {}), (CHUNK, DOCS)],
    "doc_start-on-every-rank": [(CHUNK, DOCS), (CHUNK, DOCS)],
    "other-option-on-rank-0": [(CHUNK, {"chunk_len": 4}), (CHUNK, {})],
    # tensors only the operator's own checks refuse (they once ran after the exchange, on one rank)
    "bias-on-rank-1": [(CHUNK, {}), (CHUNK, {"tamper": "bias"})],
    "codes-on-rank-0": [(CHUNK, {"tamper": "codes"}), (CHUNK, {})],
    "state-on-rank-1": [(CHUNK, {}), (CHUNK, {"tamper": "state"})],
    "backend-on-rank-0": [(CHUNK, {"backend": "fused"}), (CHUNK, {})],
}
OTHER = "vq_attention refused this rank's input (that rank's own error says why)"
OWN = {  # what the refusing rank itself says
    "bias-on-rank-1": "rank 1: bias must be [B, H, T, 2L] = [1, 2, 8, 8], got [1, 2, 8, 7]",
    "codes-on-rank-0": "rank 0: z must lie in [0, S) = [0, 3), got codes from 0 to 3",
    "state-on-rank-1": "rank 1: state was built with block_len=2, got block_len=4: which keys a state holds in its "
                       "window and which it summarizes depends on the block length",
    "backend-on-rank-0": "rank 0: backend must be one of eager, triton, got 'fused'",
}
EXPECTED = {
    "short-chunk-on-rank-1": "rank 1: context parallelism splits sequences into chunks of whole blocks: a chunk of 6 "
                             "tokens is not a positive multiple of block_len=4; make each rank's share of the sequence "
                             "a multiple of 4",
    "window-only-on-rank-0": f"rank 0: {OPTION_REFUSALS['compressive_cache']}",
    "doc_start-on-rank-1": f"rank 1: {OPTION_REFUSALS['doc_start']}",
    "doc_start-on-every-rank": f"rank 0: {OPTION_REFUSALS['doc_start']}",
    "other-option-on-rank-0": f"rank 0: {OPTION_REFUSALS[None]}",
    **{name: f"rank {own[5]}: {OTHER}" for name, own in OWN.items()},
}


def tampered(inputs, tamper, codebook):
    """This rank's ``(q, k_hat, v, bias, z, state)`` with one of them made what the operator refuses."""
    q, k_hat, v, bias, z, state = inputs
    if tamper == "bias":
        bias = bias[..., :-1]
    elif tamper == "codes":
        z = z.clone()
        z[0, 0, 0] = S
    elif tamper == "state":
        _, state = vq_attention(q[:, :, :2], k_hat[:, :, :2], v[:, :, :2], bias[:, :, :2, :4], block_len=2,
                                z=z[:, :, :2], codebook=codebook)
    return q, k_hat, v, bias, z, state


def worker(rank, world):
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, 2 * CHUNK, L, S)
    refusals = {}
    for name, per_rank in SCENARIOS.items():
        length, options = per_rank[rank]
        options = dict(options)
        mine = slice(rank * CHUNK, rank * CHUNK + length)
        q_r, k_r, v_r, bias_r, z_r, state = tampered(
            (q[:, :, mine], k_hat[:, :, mine], v[:, :, mine], bias[:, :, mine], z[:, :, mine], None),
            options.pop("tamper", None), codebook)
        start = time.monotonic()
        try:
            vq_attention_context_parallel(q_r, k_r, v_r, bias_r, block_len=L, group=group, z=z_r, codebook=codebook,
                                          state=state, **options)
            refusals[name] = (None, time.monotonic() - start)
        except ValueError as error:
            refusals[name] = (str(error), time.monotonic() - start)
    # after the refusals the ranks are still in step: a good call works
    mine = slice(rank * CHUNK, (rank + 1) * CHUNK)
    out, _ = vq_attention_context_parallel(q[:, :, mine], k_hat[:, :, mine], v[:, :, mine], bias[:, :, mine],
                                           block_len=L, group=group, z=z[:, :, mine], codebook=codebook)
    return {"refusals": refusals, "out": out.detach()}


def test_every_rank_refuses_together(tmp_path):
    results = run_gloo(worker, 2, tmp_path)
    for name, expected in EXPECTED.items():
        for rank, result in enumerate(results):
            message, seconds = result["refusals"][name]
            refusing = name in OWN and f"rank-{rank}" in name
            assert message == (OWN[name] if refusing else expected), f"{name}, rank {rank}"
            assert seconds < TIMEOUT_S / 2, f"{name}, rank {rank} waited {seconds:.1f} s"
    q, k_hat, z, v, codebook, bias = make_vq_inputs(B, H, G, 2 * CHUNK, L, S)
    out, _ = vq_attention(q, k_hat, v, bias, block_len=L, z=z, codebook=codebook)
    torch.testing.assert_close(torch.cat([r["out"] for r in results], dim=2), out, rtol=1e-12, atol=1e-12)
