"""A router's own record of where it sent each prompt prefix.

The hint mirror says what replicas *hold*; under memory pressure engines evict a prefix
between two requests that share it, the mirror then shows no holder, and a router that
follows only the mirror sends the next request anywhere — the prefix is copied to
another replica, which evicts someone else's, and so on (the hot-spot and death-spiral
reports in the routers of this field). SGLang's model gateway and Ray's prefix router
route on their own routing history instead. :class:`Placements` keeps that history as a
weak hint beside the mirror: for a prompt's block hashes at a few checkpoint depths
(4, 8, 16, ... blocks; a chained hash names its whole prefix), the replica the last
request with that prefix was sent to. The ``firstlight`` policy reads it for its
affinity penalty only (ranking), never for predicted prefill.

Bounded (least recently routed checkpoints dropped first); a replica that is gone is
simply no candidate, so its placements count for nothing. Pure; O(checkpoints) per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["CHECKPOINTS", "Placements"]

CHECKPOINTS = tuple(2**k for k in range(2, 13))
"""Prefix depths, in blocks, at which placements are recorded (4 to 4,096)."""


class Placements:
    """Checkpoint block hash → the replica the last request with that prefix went to."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be at least 0, got {max_entries}")
        self._max = max_entries
        self._where: OrderedDict[int, str] = OrderedDict()

    def record(self, block_hashes: Sequence[int], replica_id: str) -> None:
        """A request with ``block_hashes`` was sent to ``replica_id`` (``on_routed``)."""
        if not self._max:
            return
        where, count = self._where, len(block_hashes)
        for depth in CHECKPOINTS:
            if depth > count:
                break
            key = block_hashes[depth - 1]
            where[key] = replica_id
            where.move_to_end(key)
        while len(where) > self._max:
            where.popitem(last=False)

    def held(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For each replica a request sharing a prefix of ``block_hashes`` was last sent
        to, the deepest such checkpoint (in blocks); read on every decision."""
        out: dict[str, int] = {}
        where, count = self._where, len(block_hashes)
        for depth in CHECKPOINTS:
            if depth > count:
                break
            replica_id = where.get(block_hashes[depth - 1])
            if replica_id is not None:
                out[replica_id] = depth
        return out

    def __len__(self) -> int:
        return len(self._where)
