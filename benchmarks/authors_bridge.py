"""What the comparisons with the authors' JAX code share: their source, the JAX interpreter, and our layer's
parameters in their layout.

The authors' code (github.com/transformer-vq/transformer_vq, branch ``optimized``) is never imported here: it runs in
a separate JAX environment (jax/jaxlib 0.4.13, flax 0.6.11, chex 0.1.7, numpy 1.26) through the scripts of
``benchmarks/jax_side/``. ``--authors`` (or ``TVQ_AUTHORS``) names either a bare git clone of their repository (the
branch is extracted with ``git archive``) or an extracted copy holding ``src/transformer_vq``; ``--jax-python`` (or
``TVQ_JAX_PYTHON``) names the interpreter of the JAX environment. docs/benchmarks.md, "The authors' layer".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from transformer_vq import GatedAttentionUnit
from transformer_vq.config import TransformerVQConfig
from transformer_vq.config.flags import not_empty

JAX_SIDE = Path(__file__).resolve().parent / "jax_side"
BRANCH = "optimized"


def add_authors_flags(parser) -> None:
    """``--authors`` and ``--jax-python``, defaulting to ``TVQ_AUTHORS`` and ``TVQ_JAX_PYTHON``."""
    parser.add_argument("--authors", type=not_empty, default=os.environ.get("TVQ_AUTHORS") or None,
                        help="the authors' repository: a bare git directory or an extracted copy (env TVQ_AUTHORS)")
    parser.add_argument("--jax-python", type=not_empty, default=os.environ.get("TVQ_JAX_PYTHON") or None,
                        help="python of the JAX environment (env TVQ_JAX_PYTHON)")


def require_authors(args) -> None:
    """A clear error when the authors' code or the JAX python is not named, saying which flag or variable gives it."""
    for value, what, flag, env in ((args.authors, "the authors' repository", "--authors", "TVQ_AUTHORS"),
                                   (args.jax_python, "the JAX environment's python", "--jax-python", "TVQ_JAX_PYTHON")):
        if not value:
            raise SystemExit(f"error: {what} is not known: pass {flag} or set {env}")


def authors_source(source: str, dest: Path, branch: str = BRANCH) -> tuple[Path, str | None]:
    """The authors' ``src`` folder and its commit: ``source`` itself when it holds ``src/transformer_vq``, else the
    branch ``branch`` of the git directory ``source`` extracted under ``dest``."""
    root = Path(source)
    if (root / "src" / "transformer_vq").is_dir():
        return root / "src", None
    commit = subprocess.run(["git", f"--git-dir={root}", "rev-parse", branch], capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"error: {root} is neither the authors' source (src/transformer_vq) nor a git directory "
                         f"with a branch {branch!r}: {commit.stderr.strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", f"--git-dir={root}", "archive", branch, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src", commit.stdout.strip()


def jax_env() -> dict:
    """The environment of a JAX-side process: ours without PYTHONPATH (which may point at this project, whose package
    has the authors' package's name)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_jax_side(jax_python: str, script: str, *args: str) -> None:
    """Run ``benchmarks/jax_side/<script>`` in the JAX environment, its output passed through; fail loudly."""
    done = subprocess.run([jax_python, str(JAX_SIDE / script), *args], env=jax_env(), cwd=JAX_SIDE)
    if done.returncode != 0:
        sys.exit(f"error: the JAX side ({script}) failed with exit status {done.returncode}")


def gau_config(dims: dict, **overrides) -> TransformerVQConfig:
    """Our config of the authors' layer: one single-head gated attention unit with ``D_v = 2 D_m`` (their 'shga')."""
    return TransformerVQConfig(d_model=dims["d_model"], d_k=dims["d_k"], d_v=2 * dims["d_model"],
                               n_code=dims["n_code"], block_len=dims["block_len"], n_layers=1,
                               max_wavelength=dims.get("max_wavelength", 1e5), **overrides)


def authors_params(unit: GatedAttentionUnit) -> dict[str, np.ndarray]:
    """Our unit's parameters under the authors' names (flax ``Dense`` kernels are ``[in, out]``: transposed)."""
    def kernel(linear):
        return linear.weight.detach().T.double().numpy()

    return {
        "qkvg_producer/q_proj/kernel": kernel(unit.w_q),
        "qkvg_producer/k_proj/kernel": kernel(unit.w_k),
        "qkvg_producer/v_proj/kernel": kernel(unit.w_v),
        "qkvg_producer/g_proj/kernel": kernel(unit.w_g),
        "res_proj/kernel": kernel(unit.w_o),
        "xl_bias_producer/xl_r_proj/kernel": kernel(unit.w_r),
        "xl_bias_producer/xl_u": unit.u.detach()[0].double().numpy(),
        "xl_bias_producer/xl_v": unit.v_r.detach()[0].double().numpy(),
        "quantizer/c_sum": unit.quantizer.ema_sum.double().numpy(),
        "quantizer/c_count": unit.quantizer.ema_count.double().numpy(),
    }


def randomize(unit: GatedAttentionUnit, seed: int) -> None:
    """Trained-looking position and codebook parameters both sides represent exactly.

    ``u``, ``v_r`` are non-zero so every position term takes part. The authors' quantizer picks codes in float32
    from a codebook cast to float32; codewords whose sums are float32 numbers and whose counts are powers of two are
    the same in both codes, so only a near-tie of distances (rare) could pick another code.
    """
    gen = torch.Generator().manual_seed(seed)
    quantizer = unit.quantizer
    with torch.no_grad():
        unit.u.copy_(torch.randn(unit.u.shape, generator=gen) * 0.5)
        unit.v_r.copy_(torch.randn(unit.v_r.shape, generator=gen) * 0.5)
        sums = torch.randn(quantizer.ema_sum.shape, generator=gen) * unit.d_k ** -0.25
        quantizer.ema_sum.copy_(sums.float())
        quantizer.ema_count.copy_(2.0 ** torch.randint(-1, 3, quantizer.ema_count.shape, generator=gen))
