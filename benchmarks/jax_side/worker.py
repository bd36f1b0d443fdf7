"""The authors' whole layer (branch ``optimized``, serial reduction, float32) as a persistent timing worker: the JAX
half of benchmarks/jax_layer.py, speaking benchmarks/worker_protocol.py.

    /path/to/jax/python benchmarks/jax_side/worker.py --src AUTHORS_SRC --params PARAMS.npz

``PARAMS.npz`` holds the layer's parameters under ``param:<authors' name>`` and ``dims`` (a JSON string). ``fwd`` is
the jitted layer; ``fwdbwd`` the jitted gradient of the sum of its output with respect to the parameters and the
input (evaluation mode, as our side: no dropout, no codebook update).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from authors import import_authors, make_config, whole_layer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worker_protocol import serve  # noqa: E402


def positive_int(text: str) -> int:
    """The type of ``--batch``, worded as ``transformer_vq.config.flags.int_at_least(1)``, which this side cannot
    import (the JAX environment runs without this project's package)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


positive_int.bounds = {"min": 1, "max": None, "min_open": False, "max_open": False}  # as float_in keeps its bounds


def not_empty(text: str) -> str:
    """The type of a free-text flag (a path), worded as ``transformer_vq.config.flags.not_empty``, which this side
    cannot import either: an empty word would otherwise fail late, with a traceback."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {text!r}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=not_empty, required=True, help="the authors' src folder (branch optimized)")
    parser.add_argument("--params", type=not_empty, required=True)
    parser.add_argument("--batch", type=positive_int, default=1)
    args = parser.parse_args()
    modules = import_authors(args.src, float64=False)
    import flax
    import jax
    import jax.numpy as jnp
    import jaxlib

    data = np.load(args.params)
    dims = json.loads(str(data["dims"]))
    flat = {k.removeprefix("param:"): data[k] for k in data.files if k.startswith("param:")}

    def prepare(length: int) -> dict:
        config = make_config(modules, dims, dtype="float32", batch=args.batch, seq_len=length)
        apply, params = whole_layer(modules, config, flat, args.batch)
        x = jax.random.normal(jax.random.PRNGKey(0), (args.batch, length, dims["d_model"]), jnp.float32)
        forward = jax.jit(apply)
        backward = jax.jit(jax.grad(lambda p, y: apply(p, y).sum(), argnums=(0, 1)))
        return {"fwd": lambda: forward(params, x).block_until_ready(),
                "fwdbwd": lambda: jax.block_until_ready(backward(params, x))}

    serve(prepare, {"side": "authors-jax", "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                    "flax": flax.__version__, "numpy": np.__version__, "devices": [str(d) for d in jax.devices()],
                    "xla_flags": os.environ.get("XLA_FLAGS", "")})


if __name__ == "__main__":
    main()
