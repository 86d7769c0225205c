"""The true cache view: simulated replicas' real prefix caches as a routing cache view.

Implements :class:`firstlight.routing.views.TieredCacheView` over simulated replicas, from
their real prefix caches rather than announced hints (no delay, no TTL, no lost
events): hints without delay, for tests that need routing on exact cache state. Called
once per routing decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from firstlight.engine.sim.core import SimCore

__all__ = ["TrueCacheView"]


class TrueCacheView:
    """Replica id → :class:`SimCore`, seen as a :class:`~firstlight.routing.views.CacheView`.

    The mapping is read at every lookup, so replicas added to it later are seen.
    """

    __slots__ = ("_replicas",)

    def __init__(self, replicas: Mapping[str, SimCore]) -> None:
        self._replicas = replicas

    def longest_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For each replica holding the chain's first block, how many leading blocks of
        ``block_hashes`` it caches now; replicas holding none are absent, as in
        :meth:`firstlight.hints.HintMirror.longest_prefix`. Never raises."""
        if not block_hashes:
            return {}
        counts: dict[str, int] = {}
        for replica_id, core in self._replicas.items():
            blocks = core.cached_prefix_blocks(block_hashes)
            if blocks:
                counts[replica_id] = blocks
        return counts

    def host_prefix(self, block_hashes: Sequence[int], device: Mapping[str, int]) -> dict[str, int]:
        """For each replica, how many blocks of ``block_hashes`` its host tier holds right
        after its ``device`` run (from the first block for replicas absent from
        ``device``); replicas holding none are absent, as in
        :meth:`firstlight.hints.HintMirror.host_prefix`. Never raises."""
        if not block_hashes:
            return {}
        counts: dict[str, int] = {}
        for replica_id, core in self._replicas.items():
            blocks = core.host_prefix_blocks(block_hashes, device.get(replica_id, 0))
            if blocks:
                counts[replica_id] = blocks
        return counts
