"""The authors' layer on given parameters and input, in float64: the JAX half of benchmarks/authors_crosscheck.py.

    /path/to/jax/python benchmarks/jax_side/crosscheck.py --src AUTHORS_SRC --io IN.npz OUT.npz

``IN.npz`` holds ``x [B, T, D]``, the parameters under ``param:<authors' name>`` and ``dims`` (a JSON string:
d_model, d_k, n_code, block_len, max_wavelength). ``OUT.npz`` gets the residual branch of the authors' layer twice:
``whole`` from their whole-sequence layer (``attn2.VQAttention``, serial reduction) and ``blocks`` from their
block-by-block layer carrying its state from block to block (``attn1.VQAttentionOld``), both ``[B, T, D]``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from authors import block_layer, import_authors, make_config, whole_layer
from worker import not_empty  # the JAX side's own flag types (this project's package is not importable here)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=not_empty, required=True, help="the authors' src folder (branch optimized)")
    parser.add_argument("--io", type=not_empty, nargs=2, required=True, metavar=("IN", "OUT"))
    args = parser.parse_args()
    modules = import_authors(args.src, float64=True)
    import jax.numpy as jnp

    data = np.load(args.io[0])
    dims = json.loads(str(data["dims"]))
    flat = {k.removeprefix("param:"): data[k] for k in data.files if k.startswith("param:")}
    x = jnp.asarray(data["x"], dtype=jnp.float64)
    batch, length, _ = x.shape
    config = make_config(modules, dims, dtype="float64", batch=batch, seq_len=length)
    apply, params = whole_layer(modules, config, flat, batch)
    whole = np.asarray(apply(params, x))
    step, params, state = block_layer(modules, config, flat, batch)
    outs = []
    for start in range(0, length, dims["block_len"]):
        state, out = step(params, state, x[:, start:start + dims["block_len"]])
        outs.append(np.asarray(out))
    np.savez(args.io[1], whole=whole, blocks=np.concatenate(outs, axis=1))


if __name__ == "__main__":
    main()
