"""The methods ``tvq bench op`` times: each one's inputs, its FLOP count and the call that computes its output.

Causal methods:
  * ``vq-serial``, ``vq-matmul``, ``vq-assoc``: ``transformer_vq.ops.vq.vq_attention`` with each cache reduction;
  * ``vq-triton``: the same operator with ``backend="triton"`` (fused kernels, serial reduction; a GPU's method: on a
    CPU it runs under Triton's interpreter, for tests only);
  * ``vq-qk``: ``transformer_vq.ops.vq_qk.vq_qk_attention`` (queries quantized too; serial reduction);
  * ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` with no bias, the fastest exact
    quadratic attention PyTorch offers (the yardstick of the speedup targets);
  * ``full``: ``transformer_vq.ops.full.full_attention``, the project's quadratic baseline (SDPA with the window bias);
  * ``flash``: ``transformer_vq.ops.flash.flash_attention`` (mixed chunk), ``flash_quad`` (squared ReLU, quadratic).

Non-causal methods (every query attends every key, no local bias: Theorems 3.4-3.5 as the VQ-QK report measures):
  * ``vq-bidir``: ``transformer_vq.ops.vq_bidir.vq_bidir_attention`` with ``bias=None``;
  * ``vq-qk-bidir``: ``transformer_vq.ops.vq_qk.vq_qk_attention_noncausal`` (one output row per query code);
  * ``sdpa-bidir``: SDPA with ``is_causal=False``.

Every method reads the same inputs, made as the layer makes them. The queries are codewords of a random query codebook
(``q = C_Q[z_q]``), so the methods with quantized queries take exactly the inputs the others do; the values of the
inputs do not change any method's time.
"""

from __future__ import annotations

import torch

from transformer_vq.bench.config import OP_METHOD_MODELS, OpBenchConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CAUSAL_VQ = tuple(m for m, model in OP_METHOD_MODELS.items() if model == {"attn_type": "vq", "causal": True})
NONCAUSAL_VQ = tuple(m for m, model in OP_METHOD_MODELS.items() if model == {"attn_type": "vq", "causal": False})


def is_vq(method: str) -> bool:
    """Whether ``method`` is one of the library's VQ operators (the ones speedups are reported for)."""
    return method in CAUSAL_VQ + NONCAUSAL_VQ


def baselines_of(method: str) -> tuple[str, ...]:
    """The quadratic methods a VQ method's speedup is taken against: the causal or the non-causal ones."""
    return ("sdpa-bidir",) if method in NONCAUSAL_VQ else ("sdpa", "full", "flash")


def forward_flops(method: str, cfg: OpBenchConfig, length: int) -> float:
    """Matmul FLOPs the method executes in the forward pass (multiply-add = 2 FLOPs; elementwise work, gathers and
    scatters not counted).

    * VQ, per query and head: scores against S codewords and the 2L keys of the two-block window (the current
      block is computed whole, then masked), then the same weights times the values:
      ``2 (S + 2L) (Dk + Dv)``. The ``matmul`` reduction adds its lower-triangular product over blocks,
      ``2 * N (N + 1) / 2 * S * Dv`` per group; ``serial`` and ``assoc`` merge elementwise (not counted).
    * vq-qk: the table ``2 S^2 Dk`` per head, then per query the window scores ``2 * 2L Dk`` and the weights times
      the values ``2 (S + 2L) Dv`` (the codeword scores are looked up).
    * vq-bidir: ``2 S (Dk + Dv)`` per query and head. vq-qk-bidir: the table and one row per query code,
      ``2 S^2 (Dk + Dv)`` per head, whatever T.
    * SDPA causal: the kernel skips masked tiles, so ``2 * T^2 / 2 * (Dk + Dv)`` per head; non-causal twice that.
    * full / flash_quad: one block of L query rows at a time against every key up to the block's end:
      ``2 * sum_n L * (n + 1) L * (Dk + Dv)`` per head.
    * flash: ``2 T C (Dk + Dv)`` per head inside chunks, plus ``2 T Dk Dv`` per group for the chunk sums of
      ``k v^T`` and ``2 T Dk Dv`` per head to apply them.
    """
    m = cfg.model
    b, h, g = cfg.batch_size, m.n_head, m.n_kv_head
    d = m.d_k + m.d_v
    L, S = m.block_len, m.n_code
    if method == "vq-qk":
        return float(2 * h * S * S * m.d_k + 2 * b * h * length * (2 * L * m.d_k + (S + 2 * L) * m.d_v))
    if method == "vq-bidir":
        return float(2 * b * h * length * S * d)
    if method == "vq-qk-bidir":
        return float(2 * h * S * S * m.d_k + 2 * b * h * S * S * m.d_v)
    if method.startswith("vq"):
        flops = 2 * b * h * length * (S + 2 * L) * d
        if method == "vq-matmul":
            n = length // L
            flops += 2 * b * g * n * (n + 1) / 2 * S * m.d_v
        return float(flops)
    if method in ("sdpa", "sdpa-bidir"):
        return float(b * h * length * length * d * (2 if method == "sdpa-bidir" else 1))
    if method in ("full", "flash_quad"):
        keys = sum(min(length, (n + 1) * L) * (min(length, (n + 1) * L) - n * L) for n in range(-(-length // L)))
        return float(2 * b * h * keys * d)
    if method == "flash":
        C = m.flash_chunk_len
        padded = -(-length // C) * C
        return float(2 * b * h * padded * C * d + 2 * (b * g + b * h) * padded * m.d_k * m.d_v)
    raise ValueError(method)


def vq_matmuls(cfg: OpBenchConfig, length: int):
    """A closure running only the matmuls of the VQ operator's forward at ``T = length``, at their shapes, into
    buffers made once: per group of ``R`` heads, the window scores ``(N, R L, Dk) x (N, Dk, 2L)``, the codeword scores
    ``(R T, Dk) x (Dk, S)``, the cache values ``(N, R L, S) x (N, S, Dv)`` and the window values
    ``(N, R L, 2L) x (N, 2L, Dv)``: :func:`forward_flops` of ``vq-serial`` exactly.

    The fair yardstick of the operator's matmul rate: the same dtype, threads and shapes (a square product of side
    2048 is the best case of the CPU's GEMM; products with an inner dimension of ``Dk = 128`` run slower), so the
    operator's time over this one is the share of its time spent at its own matmuls' rate.
    """
    m = cfg.model
    L, S, Dk, Dv = m.block_len, m.n_code, m.d_k, m.d_v
    N, R, batch = length // L, m.n_head // m.n_kv_head, cfg.batch_size * m.n_kv_head
    if length % L:
        raise ValueError(f"the matmul yardstick needs whole blocks: T={length} is not a multiple of L={L}")
    gen = torch.Generator().manual_seed(cfg.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(cfg.device, DTYPES[cfg.precision])

    q, k_window, codebook = rand(batch, N, R * L, Dk), rand(batch, N, Dk, 2 * L), rand(batch, Dk, S)
    w_window, w_cache = rand(batch, N, R * L, 2 * L), rand(batch, N, R * L, S)
    v_window, cache_mean = rand(batch, N, 2 * L, Dv), rand(batch, N, S, Dv)
    s_window, s_cache, out = rand(batch, N, R * L, 2 * L), rand(batch, N * R * L, S), rand(batch, N, R * L, Dv)

    def call():
        torch.matmul(q, k_window, out=s_window)
        torch.matmul(q.view(batch, N * R * L, Dk), codebook, out=s_cache)
        torch.matmul(w_cache, cache_mean, out=out)
        out.view(-1, R * L, Dv).baddbmm_(w_window.view(-1, R * L, 2 * L), v_window.view(-1, 2 * L, Dv))
        return out

    return call


def make_inputs(cfg: OpBenchConfig, length: int) -> dict:
    """Inputs as the layer makes them: RMS-normalized codewords scaled by ``Dk^-1/4`` (queries and keys), SiLU values,
    a small bias."""
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = DTYPES[cfg.precision]
    m = cfg.model
    b, h, g = cfg.batch_size, m.n_head, m.n_kv_head

    def unit(*shape):
        x = torch.randn(*shape, generator=gen)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True)) * m.d_k**-0.25

    def lookup(codebook, codes):  # (G, S, Dk), (B, G, T) -> (B, G, T, Dk)
        return torch.gather(codebook.unsqueeze(0).expand(b, -1, -1, -1), 2,
                            codes.unsqueeze(-1).expand(-1, -1, -1, m.d_k))

    codebook_q = unit(h, m.n_code, m.d_k)
    z_q = torch.randint(0, m.n_code, (b, h, length), generator=gen)
    codebook = unit(g, m.n_code, m.d_k)
    z = torch.randint(0, m.n_code, (b, g, length), generator=gen)
    v = torch.nn.functional.silu(torch.randn(b, g, length, m.d_v, generator=gen))
    bias = 0.1 * torch.randn(b, h, length, 2 * m.block_len, generator=gen)
    # drawn on the CPU (the same numbers on every device), then moved
    inputs = {"q": lookup(codebook_q, z_q).to(dtype), "k": lookup(codebook, z).to(dtype), "z": z, "z_q": z_q,
              "v": v.to(dtype), "codebook": codebook.to(dtype), "codebook_q": codebook_q.to(dtype),
              "bias": bias.to(dtype)}
    return {name: t.to(cfg.device) for name, t in inputs.items()}


def method_fn(method: str, cfg: OpBenchConfig, x: dict):
    """A closure computing the method's output from the tensors in ``x`` (under ``torch.compile`` with
    ``cfg.torch_compile``: its first call, and its first with gradients, compile)."""
    fn = _eager_fn(method, cfg, x)
    return torch.compile(fn, dynamic=False) if cfg.torch_compile else fn


def _eager_fn(method: str, cfg: OpBenchConfig, x: dict):
    """The closure of :func:`method_fn`, uncompiled."""
    L = cfg.model.block_len
    codes = {"z": x["z"], "codebook": x["codebook"]}
    if method == "vq-qk":
        from transformer_vq.ops.vq_qk import vq_qk_attention

        return lambda: vq_qk_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, z_q=x["z_q"],
                                       codebook_q=x["codebook_q"], **codes)[0]
    if method == "vq-bidir":
        from transformer_vq.ops.vq_bidir import vq_bidir_attention

        return lambda: vq_bidir_attention(x["q"], x["k"], x["v"], None, block_len=L, **codes)[0]
    if method == "vq-qk-bidir":
        from transformer_vq.ops.vq_qk import vq_qk_attention_noncausal

        return lambda: vq_qk_attention_noncausal(x["q"], x["k"], x["v"], z_q=x["z_q"], codebook_q=x["codebook_q"],
                                                 **codes)
    if method.startswith("vq"):
        from transformer_vq.ops.vq import vq_attention

        reduction, backend = ("serial", "triton") if method == "vq-triton" else (method.split("-")[1], "eager")
        return lambda: vq_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L, reduction=reduction,
                                    backend=backend, **codes)[0]
    if method in ("sdpa", "sdpa-bidir"):
        gqa = cfg.model.n_kv_head != cfg.model.n_head
        return lambda: torch.nn.functional.scaled_dot_product_attention(
            x["q"], x["k"], x["v"], is_causal=method == "sdpa", scale=1.0, enable_gqa=gqa)
    if method == "full":
        from transformer_vq.ops.full import full_attention

        return lambda: full_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L)[0]
    if method == "flash":
        from transformer_vq.ops.flash import flash_attention

        return lambda: flash_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L,
                                       chunk_len=cfg.model.flash_chunk_len)[0]
    if method == "flash_quad":
        from transformer_vq.ops.flash import flash_quad_attention

        return lambda: flash_quad_attention(x["q"], x["k"], x["v"], x["bias"], block_len=L)[0]
    raise ValueError(method)
