"""Which operator a gated attention unit calls, and with what: the one place that maps a model config to a kernel.

* causal, ``attn_type`` 'vq': :func:`~transformer_vq.ops.vq.vq_attention` (keys quantized; whole blocks by
  ``cfg.attn_backend``, eager torch ops or the fused Triton kernels), or with
  ``quantize_queries`` :func:`~transformer_vq.ops.vq_qk.vq_qk_attention` (queries too, scores from the code-pair
  table); the baselines through :data:`~transformer_vq.ops.KERNELS`;
* non-causal (``causal=False``, an encoder): :func:`~transformer_vq.ops.vq_bidir.vq_bidir_attention` (with the
  table's scores when queries are quantized), or :func:`~transformer_vq.ops.full.bidir.full_bidir_attention`;
* ``attention="quadratic"``: the dense formula of the same attention, for tests and the ``tvq demo`` comparison.
* ``context_parallel`` (a process group): causal VQ attention of one chunk of a sequence split along time over the
  group's ranks, :func:`~transformer_vq.ops.vq.context_parallel.vq_attention_context_parallel`.

The FLASH baselines get the window bias divided by their normalizer ``n`` (:func:`flash_norm`).

``compressive_cache`` false (causal VQ only) makes every query attend its two-block window alone, in the kernel and
in the dense formula alike.

The unit's content query is ``q + u`` (Transformer-XL's content bias). With quantized queries that is ``q_hat + u``,
the codeword shifted by ``u``: the table is built from the shifted query codebook ``C_Q + u``, so its rows are
exactly the scores of the query the unit attends with.
"""

from __future__ import annotations

import torch

from transformer_vq.config import TransformerVQConfig
from transformer_vq.nn.quantizer import QuantizerOutput
from transformer_vq.ops import KERNELS, vq_attention_naive
from transformer_vq.ops.full.bidir import full_bidir_attention
from transformer_vq.ops.vq.context_parallel import vq_attention_context_parallel
from transformer_vq.ops.vq_bidir import vq_bidir_attention, vq_bidir_attention_naive
from transformer_vq.ops.vq_qk import code_pair_table, lookup_code_scores, vq_qk_attention

ATTENTION_MODES = ("linear", "quadratic")


def attend(cfg: TransformerVQConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
           state, mask: torch.Tensor | None, attention: str, keys: QuantizerOutput | None = None,
           queries: QuantizerOutput | None = None, query_shift: torch.Tensor | None = None,
           table: torch.Tensor | None = None, context_parallel=None, doc_start: torch.Tensor | None = None,
           cache_bias: torch.Tensor | None = None):
    """``(out [B, H, T, Dv], state)`` of the unit's attention.

    Args:
        q: ``[B, H, T, Dk]`` content queries (``q + u``; ``q_hat + u`` with quantized queries).
        k: ``[B, G, T, Dk]`` keys (``k_hat`` when quantized). v: ``[B, G, T, Dv]``.
        bias: ``[B, H, T, 2L]`` (causal) or ``[B, H, T, 3L]`` (non-causal) window bias.
        keys: the key quantizer's output (``None``: unquantized keys). queries: the query quantizer's output.
        query_shift: ``[H, Dk]`` the content bias ``u`` (scaled) added to the query codewords.
        table: the code-pair table of these codebooks when the caller holds it (decoding); ``None``: computed here.
        context_parallel: the process group over whose ranks the sequence is split along time (``None``: not split);
            ``state`` is then the state at the start of the whole sequence, and so is the one returned at its end.
        doc_start: ``[B, T]`` bool, where packed documents begin (:mod:`transformer_vq.ops.documents`).
        cache_bias: ``[H]`` the unit's logit on keys older than the window (``cfg.cache_bias_init``), or ``None``.
    """
    check_call(cfg, attention, state, doc_start, context_parallel)
    L = cfg.block_len
    if context_parallel is not None:
        problem = cfg.context_parallel_problem() or (attention == "quadratic" and "attention='linear'")
        if problem:
            raise ValueError(f"context parallelism {problem}")
        return vq_attention_context_parallel(q, k, v, bias, block_len=L, group=context_parallel, state=state,
                                             z=keys.z, codebook=keys.codebook, reduction=cfg.reduction,
                                             backend=cfg.attn_backend, cache_bias=cache_bias)
    if not cfg.causal:
        if keys is None:  # the quadratic baseline is its own dense formula
            return full_bidir_attention(q, k, v, bias, block_len=L, state=state, mask=mask, doc_start=doc_start)
        if attention == "quadratic":
            return vq_bidir_attention_naive(q, k, v, bias, block_len=L, mask=mask, doc_start=doc_start), None
        code_scores = None
        if queries is not None:
            if table is None:
                table = code_pair_table(shifted_codebook(queries, query_shift), keys.codebook)
            code_scores = lookup_code_scores(q, queries.z, table, keys.codebook)
        return vq_bidir_attention(q, k, v, bias, block_len=L, state=state, z=keys.z, codebook=keys.codebook,
                                  mask=mask, code_scores=code_scores, doc_start=doc_start)
    if attention == "quadratic":
        if keys is None:
            raise ValueError(f"attention='quadratic' applies to VQ attention only, not attn_type={cfg.attn_type!r}")
        return vq_attention_naive(q, k, v, bias, block_len=L, compressive_cache=cfg.compressive_cache,
                                  doc_start=doc_start, cache_bias=cache_bias), None
    if queries is not None:
        return vq_qk_attention(q, k, v, bias, block_len=L, state=state, z_q=queries.z,
                               codebook_q=shifted_codebook(queries, query_shift), z=keys.z, codebook=keys.codebook,
                               reduction=cfg.reduction, table=table, compressive_cache=cfg.compressive_cache,
                               doc_start=doc_start)
    options = {"chunk_len": cfg.flash_chunk_len} if cfg.attn_type == "flash" else {}
    if doc_start is not None:
        options["doc_start"] = doc_start
    if cfg.attn_type in FLASH_TYPES:
        bias = bias / flash_norm(cfg)
    if keys is not None:
        options = {"z": keys.z, "codebook": keys.codebook, "reduction": cfg.reduction,
                   "compressive_cache": cfg.compressive_cache, "backend": cfg.attn_backend, "doc_start": doc_start,
                   "cache_bias": cache_bias}
    return KERNELS[cfg.attn_type](q, k, v, bias, block_len=L, state=state, **options)


def check_call(cfg: TransformerVQConfig, attention: str, state, doc_start: torch.Tensor | None,
               context_parallel) -> None:
    """Raise ``ValueError`` for an unknown ``attention``, a state given to the dense reference, and packed documents
    (``doc_start``) given to a unit that does not take them yet."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
    if attention == "quadratic" and state is not None:
        raise ValueError("attention='quadratic' runs the dense reference on whole sequences: pass state=None")
    if doc_start is not None and context_parallel is not None:
        raise ValueError("context parallelism does not take packed documents yet (position_ids or cu_seqlens): "
                         "leave context_parallel at 1 to pack")


FLASH_TYPES = ("flash_quad", "flash")


def flash_norm(cfg: TransformerVQConfig) -> int:
    """``n``, the length a FLASH kernel divides its content scores ``q . k`` by: ``flash_chunk_len`` for 'flash',
    ``block_len`` (the kernel's default ``norm_len``) for 'flash_quad'.

    The unit divides the window bias by the same ``n`` before the kernel adds it, so the whole pre-activation is
    ``(q . k + beta) / n``. The bias is a softmax-sized logit (``(q + v_r) . R_d``, about 1 at initialization); added
    undivided, ``relu(beta)^2`` summed over a chunk of ``n`` keys made the output about ``n / 10`` times too large and
    the first loss ~30 bits per byte. Divided, it starts near zero, as FLASH's own bias does (Hua et al. 2022,
    Code 4: initialized with standard deviation 0.02).
    """
    return cfg.flash_chunk_len if cfg.attn_type == "flash" else cfg.block_len


def shifted_codebook(queries: QuantizerOutput, query_shift: torch.Tensor) -> torch.Tensor:
    """``[H, S_q, Dk]``: the query codewords plus the content bias ``u`` of their head (a constant to the table)."""
    return queries.codebook + query_shift.detach()[:, None, :].to(queries.codebook.dtype)
