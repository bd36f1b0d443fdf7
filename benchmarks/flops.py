"""Count the matrix-product FLOPs of a call, to set a time against the machine's matmul rate.

``torch.utils.flop_counter`` counts ``mm``, ``bmm``, ``addmm``, ``baddbmm`` and the attention kernels, but not the
in-place ``baddbmm_`` by which the VQ operator accumulates its products (ops/vq/kernels.py ``add_product``): that
one is added here. Elementwise work is not counted: a call's FLOPs over the matmul rate is the least time it can take.

It lives beside the benchmarks, not in the package: benchmarks/layer_versions.py runs this folder's workers against
older revisions of the package.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def _baddbmm_flops(total_shape, batch1_shape, batch2_shape, *_, out_shape=None, **__) -> int:
    """``2 b n k m`` for ``total += batch1 [b, n, k] @ batch2 [b, k, m]`` (the add is not counted, as for ``mm``)."""
    b, n, k = batch1_shape
    return 2 * b * n * k * batch2_shape[-1]


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matrix products ``fn()`` runs (it is run once, untimed)."""
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: _baddbmm_flops}) as counter:
        fn()
    return counter.get_total_flops()
