"""The authors' JAX layer (their branch ``optimized``) built from an extracted copy of their source.

Runs inside the JAX environment only (jax/jaxlib 0.4.13, flax 0.6.11, chex 0.1.7: newer JAX breaks their code) and
never imports this project: both packages are called ``transformer_vq``, so the authors' ``src`` goes first on
``sys.path``. Used by ``crosscheck.py`` (float64 outputs for benchmarks/authors_crosscheck.py) and ``worker.py``
(timings for benchmarks/jax_layer.py). Parameters travel as a flat ``{"a/b/kernel": array}`` dict in the authors'
layout (docs/benchmarks.md, "The authors' layer").
"""

from __future__ import annotations

import importlib
import sys


def import_authors(src: str, *, float64: bool) -> dict:
    """The authors' modules from ``src`` (their ``src`` folder), with JAX's float64 switched on when asked."""
    sys.path.insert(0, src)
    import jax

    jax.config.update("jax_enable_x64", float64)
    names = ("transformer_vq.nn.types", "transformer_vq.nn.attn1", "transformer_vq.nn.attn2")
    modules = {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in names}
    origin = modules["types"].__file__
    if not origin.startswith(src):
        raise RuntimeError(f"imported the authors' package from {origin}, not from {src}")
    return modules


def make_config(modules: dict, dims: dict, *, dtype: str, batch: int, seq_len: int, reduction: str = "serial"):
    """The authors' ``TransformerConfig`` of one layer: single-head gated attention, evaluation mode (no dropout)."""
    import jax.numpy as jnp

    return modules["types"].TransformerConfig.create(
        param_dtype=jnp.dtype(dtype), dtype=jnp.dtype(dtype), n_device=1, global_batch_size=batch,
        sequence_len=seq_len, block_len=dims["block_len"], attn_type="vq", head_type="shga",
        reduction_type=reduction, d_model=dims["d_model"], d_k=dims["d_k"], n_code=dims["n_code"], n_layer=1,
        n_vocab=256, pe_abs=False, pe_lam=dims["max_wavelength"], p_dropsin=0.0, p_dropres=0.0, p_droplyr=0.0,
        c_beta=1e-4, c_gamma=0.99, e_tie=False, e_preln=False, e_scale=1.0, is_train=False)


def params_of(flat: dict, template, dtype: str):
    """The parameter tree of ``flat`` (``"qkvg_producer/q_proj/kernel"`` -> array), checked against the layer's own
    ``template`` tree: the same names and shapes, nothing missing or extra."""
    import jax.numpy as jnp
    from flax.core import freeze
    from flax.traverse_util import flatten_dict, unflatten_dict

    expected = {k: v.shape for k, v in flatten_dict(template["params"], sep="/").items()}
    given = {k: tuple(v.shape) for k, v in flat.items()}
    if expected != given:
        raise ValueError(f"parameters differ from the authors' layer: expected {expected}, got {given}")
    tree = unflatten_dict({k: jnp.asarray(v, dtype=dtype) for k, v in flat.items()}, sep="/")
    return freeze({"params": tree})


def whole_layer(modules: dict, config, flat: dict, batch: int):
    """``(apply, params)`` of the authors' whole-sequence layer (``attn2.VQAttention``): ``apply(params, x)`` maps
    ``x [B, T, D]`` to the residual branch ``[B, T, D]`` (the layer adds no residual itself)."""
    import jax

    layer = modules["attn2"].VQAttention(config)
    T, L, D = config.sequence_len, config.block_len, config.d_model
    x = jax.ShapeDtypeStruct((batch, T // L, L, D), config.dtype)
    template = jax.eval_shape(layer.init, {"params": jax.random.PRNGKey(0)}, x)  # the tree's shapes, nothing computed
    params = params_of(flat, template, config.dtype)

    def apply(p, x):
        return layer.apply(p, x.reshape(batch, T // L, L, D))["res"].reshape(batch, T, D)

    return apply, params


def block_layer(modules: dict, config, flat: dict, batch: int):
    """``(step, params, state)`` of the authors' block-by-block layer with its carried state
    (``attn1.VQAttentionOld``): ``step(params, state, x_block) -> (state, residual branch)``, one block of ``L``."""
    import jax

    old = modules["attn1"].VQAttentionOld
    layer = old(config)
    state = old.initial_state(config, batch)
    block = jax.ShapeDtypeStruct((batch, config.block_len, config.d_model), config.dtype)
    template = jax.eval_shape(layer.init, {"params": jax.random.PRNGKey(0)}, state, block)
    params = params_of(flat, template, config.dtype)

    def step(p, s, x):
        s, out = layer.apply(p, s, x)
        return s, out["res"]

    return jax.jit(step), params, state
