"""The codebook interface every model with vector-quantized keys offers a training loop (EMA k-means, App. C).

A training loop calls ``codebook_stats()`` (all-reduce them across workers), then ``update_codebooks()`` after the
optimizer step (``reset_codebook_stats()`` for a skipped step), and logs ``codebook_metrics()``. A model lists its
quantizers; by default every :class:`~transformer_vq.nn.quantizer.VectorQuantizer` among its modules is a key
quantizer.
"""

from __future__ import annotations

import torch

from transformer_vq.nn.quantizer import VectorQuantizer


class Codebooks:
    """Mixed into an ``nn.Module`` (listed before it): the codebook methods, over the model's quantizers."""

    @property
    def quantizers(self) -> list[VectorQuantizer]:
        """Every EMA-trained codebook: the key quantizers, then the query quantizers."""
        return self._key_quantizers + self._query_quantizers

    @property
    def _key_quantizers(self) -> list[VectorQuantizer]:
        return [m for m in self.modules() if isinstance(m, VectorQuantizer)]

    @property
    def _query_quantizers(self) -> list[VectorQuantizer]:
        return []

    def codebook_stats(self, rank: int = 0, world_size: int = 1) -> list[torch.Tensor]:
        """Every quantizer's accumulated statistics: all-reduce (SUM) them across the ``world_size`` workers before
        updating, each passing its ``rank`` (:meth:`VectorQuantizer.stats`: who contributes which recent key)."""
        return [t for quantizer in self.quantizers for t in quantizer.stats(rank, world_size)]

    def update_codebooks(self) -> None:
        """Apply one EMA step to every codebook from the accumulated statistics (after the optimizer step)."""
        for quantizer in self.quantizers:
            quantizer.update()

    def reset_codebook_stats(self) -> None:
        """Discard accumulated statistics without updating (e.g. for a skipped non-finite step)."""
        for quantizer in self.quantizers:
            quantizer.reset_stats()

    def codebook_metrics(self) -> dict[str, float]:
        """Code-usage perplexity and fraction of unused codes in the last update, averaged over units (the query
        codebooks' under names starting with ``query_``)."""
        metrics = {}
        for prefix, quantizers in (("", self._key_quantizers), ("query_", self._query_quantizers)):
            per_unit = [q.metrics() for q in quantizers]
            if per_unit:
                metrics.update({prefix + key: sum(m[key] for m in per_unit) / len(per_unit) for key in per_unit[0]})
        return metrics
