"""What the ranks of a context-parallel model call agree on before any work (docs/distributed.md).

Each rank holds one chunk of the same sequences. Where a chunk sits, and how many tokens the whole sequences hold,
are the ranks' lengths summed, never one rank's length times the ranks (the chunks may differ in length, as the
operator allows): the absolute positions (``abs_pos``) and the offset of the returned state read them. A rank that
refuses its input (bad ids, a state of other sequences, padding) makes every rank raise, after the exchange, so that
none is left waiting in a collective for a rank that stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Chunks:
    """This rank's chunk within the whole sequences split over the ranks of a group."""

    start: int
    """The chunk's first token: the lengths of the ranks before it, summed."""
    total: int
    """Tokens of the whole sequences: every rank's length, summed."""


def agree_chunks(group, length: int, device: torch.device, problem: str | None = None) -> Chunks:
    """Exchange this rank's chunk ``length`` and whether it refuses its input (``problem``: why, or ``None``) with
    the ranks of ``group``; raise ``ValueError`` on every rank when any refuses (its reason on that rank, its number
    on the others)."""
    header = torch.tensor([length, problem is not None], dtype=torch.long, device=device)
    rows = [torch.empty_like(header) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, header, group=group)
    table = torch.stack(rows).tolist()  # one read of every rank's header (a host sync on a GPU)
    rank = dist.get_rank(group)
    for other, (_, refused) in enumerate(table):
        if refused:
            raise ValueError(f"rank {other}: {problem}" if other == rank else
                             f"rank {other} refused its input (that rank's own error says why)")
    return Chunks(start=sum(n for n, _ in table[:rank]), total=sum(n for n, _ in table))
