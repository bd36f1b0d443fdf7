"""Inputs and checks shared by the operator tests: every operator is held to its naive reference the same way."""

from __future__ import annotations

import torch

BLOCK_LEN = 4
MASK_MUST = r"mask must be a bool tensor of the shape of the queries' \[B, T\]"  # every operator's mask refusal
# (H, G): single-head GAU, multi-head, multi-query.
HEADS = [(1, 1), (2, 2), (4, 1)]
# Lengths shorter than a block, not a multiple of the block or the chunk, and a single token.
LENGTHS = [1, 7, 37]
GRID = [(h, g, t) for h, g in HEADS for t in LENGTHS]


def case_id(n_head, n_group, length, batch=2):
    return f"B{batch}-H{n_head}-G{n_group}-T{length}"


def make_inputs(n_head, n_group, length, dtype=torch.float64, batch=2, d_k=8, d_v=5, seed=0):
    """``q, k, v, bias`` of a baseline operator (unquantized keys), window bias of block length ``BLOCK_LEN``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_head, length, d_k, generator=gen, dtype=dtype)
    k = torch.randn(batch, n_group, length, d_k, generator=gen, dtype=dtype)
    v = torch.randn(batch, n_group, length, d_v, generator=gen, dtype=dtype)
    bias = torch.randn(batch, n_head, length, 2 * BLOCK_LEN, generator=gen, dtype=dtype)
    return q, k, v, bias


def make_vq_inputs(B, H, G, T, L, S, Dk=6, Dv=7, *, dtype=torch.float64, seed=0, scale=1.0, codes=None):
    """``q, k_hat, z, v, codebook, bias`` of the VQ operator, with ``k_hat = codebook[z]`` exactly as the quantizer
    produces."""
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.randn(G, S, Dk, generator=gen, dtype=dtype)
    z = torch.randint(0, S, (B, G, T), generator=gen) if codes is None else codes
    k_hat = codebook[torch.arange(G)[None, :, None], z]  # (B, G, T, Dk)
    q = scale * torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, G, T, Dv, generator=gen, dtype=dtype)
    bias = torch.randn(B, H, T, 2 * L, generator=gen, dtype=dtype)
    return q, k_hat, z, v, codebook, bias


# (B, H, G, T, L, S) of the VQ operators: T < L, T = 1, T not a multiple of L, B = 1, S = 1,
# (H, G) in {(1,1), (2,2), (4,1)}
VQ_GRID = [
    (2, 1, 1, 5, 8, 4),
    (1, 1, 1, 1, 4, 3),
    (2, 2, 2, 37, 8, 5),
    (1, 4, 1, 50, 4, 1),
    (2, 1, 1, 64, 8, 6),
    (1, 2, 2, 63, 16, 9),
    (2, 4, 1, 17, 4, 2),
]


def vq_grid_id(params):
    B, H, G, T, L, S = params
    return f"B{B}-H{H}-G{G}-T{T}-L{L}-S{S}"


def same_reduction_tol(device: torch.device) -> float:
    """How far two runs of one torch reduction may differ: not at all on a CPU; CUDA's ``scatter_add_`` adds
    atomically, in no fixed order, so there the last bits differ (on an H100: 1.8e-7 at most, means of O(1))."""
    return 0.0 if device.type == "cpu" else 1e-6


def assert_holds_only_what_it_reports(state):
    """A state's tensors keep alive only their own bytes, each storage counted once, which ``nbytes()`` reports: not
    the whole keys of the call that made it, or running sums over all its blocks, through slices of them."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in vars(state).values()
                if isinstance(t, torch.Tensor)}
    assert sum(storages.values()) == state.nbytes()


def assert_same_state(got, want, tol):
    """Equal VQ states: same offset, counts exactly, means within ``tol``, the window's keys, values and codes."""
    assert got.offset == want.offset
    torch.testing.assert_close(got.cache_count, want.cache_count, rtol=0, atol=0)
    torch.testing.assert_close(got.cache_mean, want.cache_mean, rtol=tol, atol=tol)
    for name in ("recent_k", "recent_v", "recent_z"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=0, msg=name)


def check_matches_naive_float64(op, naive, n_head, n_group, length):
    """Output and every gradient equal the naive formula's."""
    inputs = [x.requires_grad_() for x in make_inputs(n_head, n_group, length)]
    out, _ = op(*inputs)
    expected = naive(*inputs)
    # float64: only rounding differs (different summation order), so near machine precision.
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    cotangent = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, cotangent)
    expected_grads = torch.autograd.grad(expected, inputs, cotangent)
    for name, got, want in zip("q k v bias".split(), grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"grad {name}: {m}")


def check_matches_naive_float32(op, naive):
    inputs = make_inputs(4, 1, 37, dtype=torch.float32)
    out, _ = op(*inputs)
    expected = naive(*[x.double() for x in inputs])
    # float32 carries ~7 digits; sums of ~40 terms of size O(10) lose about two more.
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def check_causal_by_jacobian(op):
    """``d out_t / d x_s`` is zero for ``s > t`` and not all zero for ``s <= t``, for every input ``x``."""
    length = 13
    q, k, v, bias = make_inputs(2, 1, length, batch=1)
    jac = torch.autograd.functional.jacobian(lambda *x: op(*x)[0], (q, k, v, bias))
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    for name, j in zip("q k v bias".split(), jac):
        # j: [B, H, T, Dv] (output) x [B, H or G, T, D] (input); reduce to [T_out, T_in].
        dep = j.abs().sum(dim=(0, 1, 3, 4, 5, 7))
        assert dep[future].abs().max() == 0, f"output depends on future {name}"
        assert (dep[~future] != 0).any(), f"output does not depend on past {name}"


def split_points(length, gen):
    cuts = torch.randperm(length - 1, generator=gen)[:4].add(1).sort().values.tolist()
    return [0, *cuts, length]


def check_state_continuation(op, naive, n_head, n_group):
    """Calls on pieces (random cuts, then one token per call), the state carried, equal one call and the formula."""
    length = 37
    q, k, v, bias = make_inputs(n_head, n_group, length)
    whole, whole_state = op(q, k, v, bias)
    torch.testing.assert_close(whole, naive(q, k, v, bias), rtol=1e-10, atol=1e-10)
    gen = torch.Generator().manual_seed(1)
    for points in (split_points(length, gen), split_points(length, gen), list(range(length + 1))):
        state, pieces = None, []
        for a, b in zip(points[:-1], points[1:]):
            out, state = op(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], bias[:, :, a:b], state=state)
            pieces.append(out)
        torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-10, atol=1e-10)
        assert state.offset == whole_state.offset == length


# Packed documents of block length 4 and length 37: row 0 has a document of one token (3), starts at a block edge
# (4, 24), inside a block (13, 25) and several in one block (4, 5, 6); row 1 a few long documents.
DOC_STARTS = ([0, 3, 4, 5, 6, 13, 24, 25], [0, 16, 30])


def doc_start_mask(starts_per_row, length):
    """``[B, T]`` bool, True at the listed first positions of each row's documents."""
    mask = torch.zeros(len(starts_per_row), length, dtype=torch.bool)
    for row, starts in enumerate(starts_per_row):
        mask[row, starts] = True
    return mask


def documents(doc_start):
    """``(row, first, stop)`` of every document of ``doc_start [B, T]`` (a row's first run counts as one)."""
    length = doc_start.shape[1]
    for row in range(doc_start.shape[0]):
        starts = sorted({0, *doc_start[row].nonzero().flatten().tolist()})
        yield from ((row, a, b) for a, b in zip(starts, [*starts[1:], length]))


def check_documents(op, naive, n_head, n_group, length=37):
    """Packed documents (``DOC_STARTS``) in float64: the operator equals its formula with the same-document mask,
    outputs and every gradient; pieces with the state carried across boundaries equal one call; a document starting
    on a block edge equals the document run alone from position 0."""
    inputs = [x.requires_grad_() for x in make_inputs(n_head, n_group, length, seed=5)]
    doc_start = doc_start_mask(DOC_STARTS, length)
    out, _ = op(*inputs, doc_start=doc_start)
    expected = naive(*inputs, doc_start=doc_start)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    cotangent = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, cotangent)
    for name, got, want in zip("q k v bias".split(), grads, torch.autograd.grad(expected, inputs, cotangent)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"grad {name}: {m}")
    state, pieces = None, []
    for a, b in zip([0, 2, 5, 13, 14, 26], [2, 5, 13, 14, 26, length]):
        starts = doc_start[:, a:b]
        piece, state = op(*(x[:, :, a:b] for x in inputs), state=state,
                          doc_start=starts if bool(starts.any()) else None)
        pieces.append(piece)
    torch.testing.assert_close(torch.cat(pieces, dim=2), out, rtol=1e-10, atol=1e-10)
    for row, a, b in documents(doc_start):
        if a % BLOCK_LEN == 0:
            alone, _ = op(*(x[row:row + 1, :, a:b] for x in inputs))
            torch.testing.assert_close(out[row:row + 1, :, a:b], alone, rtol=1e-10, atol=1e-10)


def low_precision_runs(attend, leaves, codebook, dtype, device, seed=5):
    """``(fused, want, yardstick)``: the output and the gradients of every leaf, of the fused kernels in ``dtype``, of
    the eager operator in float32 and of the eager operator in ``dtype``, all from the same inputs rounded to ``dtype``
    (``codebook`` too, a constant: the keys stay codewords) and the same cotangent. ``attend(backend, leaves,
    codebook)`` returns the operator's output; the checks are :func:`assert_as_close_as`."""
    leaves, codebook = [x.detach().to(dtype) for x in leaves], codebook.to(dtype)
    results = {}
    for backend, dt in (("triton", dtype), ("eager", torch.float32), ("eager", dtype)):
        given = [x.to(dt).requires_grad_() for x in leaves]
        out = attend(backend, given, codebook.to(dt))
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device, dt)
        results[backend, dt] = (out, *torch.autograd.grad(out, given, cotangent))
    return results["triton", dtype], results["eager", torch.float32], results["eager", dtype]


def assert_as_close_as(got, want, yardstick, *, factor=2.0, name="output"):
    """``got`` (a fused kernel in a low precision) is as close to ``want`` (float32) as ``yardstick`` (the eager
    operator in the same low precision) is, within ``factor``: by the root-mean-square error and by the largest.

    A fixed tolerance fits low precision badly: loose for nearly every element, too tight for the few that bfloat16's
    8 bits round far (on an H100, 26 of 768,000 outputs of the fused kernel were over 0.03, at most 0.067). What the
    precision itself costs is measured instead, by the eager operator on the same rounded inputs; a wrong tile, row or
    element still shows, as errors of the size of the values.
    """
    got, want, yardstick = (x.detach().float() for x in (got, want, yardstick))
    err, ref = (got - want).abs(), (yardstick - want).abs()
    floor = 1e-6 * float(want.abs().max())  # where the yardstick is exact, allow float32's last bits

    def rms(e):
        return float(e.square().mean().sqrt())

    for what, mine, theirs in (("rms", rms(err), rms(ref)), ("max", float(err.max()), float(ref.max()))):
        assert mine <= factor * theirs + floor, (f"{name}: {what} error {mine:.3g}, the eager operator's in the same "
                                                 f"precision {theirs:.3g} (allowed {factor}x)")


def host_reads_refused(monkeypatch):
    """Every read of a tensor's values onto the host raises, and the checks read none (as on a GPU, where each read
    would wait for the device)."""
    def refused(*args, **kwargs):
        raise AssertionError("a tensor's value was read on the host")

    monkeypatch.setattr("transformer_vq.ops.protocol.reads_values", lambda tensor: False)
    for method in ("__bool__", "__float__", "__int__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, method, refused)
