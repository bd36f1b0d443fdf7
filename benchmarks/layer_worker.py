"""Our whole layer (one gated attention unit, float32) as a persistent timing worker: the project's half of
benchmarks/jax_layer.py, speaking benchmarks/worker_protocol.py.

    python benchmarks/layer_worker.py --state UNIT.pt --config CONFIG.json [--batch 1] [--retain-host-memory]

``fwd`` is the unit's forward without autograd; ``fwdbwd`` the forward with autograd and the backward of the sum of
its output to every parameter and the input. The unit is in evaluation mode, like the authors' side (no dropout, no
codebook statistics).
"""

from __future__ import annotations

import argparse
import json
import platform

import numpy
import torch
from flops import count_flops

from transformer_vq import GatedAttentionUnit
from transformer_vq.config import TransformerVQConfig
from transformer_vq.config.flags import int_at_least, not_empty
from transformer_vq.hostmem import retain_freed_memory
from worker_protocol import serve


def layer_calls(unit: GatedAttentionUnit, x: torch.Tensor) -> dict:
    """The two timed modes on input ``x``: ``fwd`` (no autograd) and ``fwdbwd`` (the backward of the output's sum to
    every parameter and the input)."""
    def forward():
        with torch.no_grad():
            unit(x)

    def forward_backward():
        unit.zero_grad(set_to_none=True)
        y = x.detach().requires_grad_()
        unit(y).x.sum().backward()

    return {"fwd": forward, "fwdbwd": forward_backward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=not_empty, required=True, help="the unit's state_dict (torch.save)")
    parser.add_argument("--config", type=not_empty, required=True, help="the unit's TransformerVQConfig as JSON")
    parser.add_argument("--batch", type=int_at_least(1), default=1)
    parser.add_argument("--retain-host-memory", action="store_true",
                        help="keep freed host memory for reuse, as tvq train does (transformer_vq/hostmem.py)")
    args = parser.parse_args()
    if args.retain_host_memory:
        retain_freed_memory()
    with open(args.config) as f:
        cfg = TransformerVQConfig.from_dict(json.load(f))
    unit = GatedAttentionUnit(cfg).eval()
    unit.load_state_dict(torch.load(args.state, weights_only=True))

    def prepare(length: int) -> dict:
        return layer_calls(unit, torch.randn(args.batch, length, cfg.d_model,
                                             generator=torch.Generator().manual_seed(0)))

    serve(prepare, {"side": "ours-torch", "torch": torch.__version__, "numpy": numpy.__version__,
                    "python": platform.python_version(), "torch_threads": torch.get_num_threads()}, count=count_flops)


if __name__ == "__main__":
    main()
