"""The approximate prefix index of the Gateway API inference extension's prefix scorer.

A flat map from block hash to the servers a request holding that block was sent to,
with one LRU of block hashes per server (``pkg/epp/scheduling/framework/plugins/multi/
prefix/indexer.go``: ``hashToPods`` and ``podToLRU``). Block hashes are chained, so a
hash stands for its whole prefix and no tree is needed. Server sets are bit masks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockIndex"]


class BlockIndex:
    """Block hash → servers it was routed to, each server's entries LRU-bounded.

    Used by the ``weighted_scorer`` policy: :meth:`match` in ``choose``, :meth:`add` in
    ``on_routed``.
    """

    def __init__(self, capacity_per_server: int) -> None:
        if capacity_per_server < 1:
            raise ValueError(f"capacity_per_server must be positive, got {capacity_per_server}")
        self._capacity = capacity_per_server
        self._servers_of: dict[int, int] = {}
        self._bit_of: dict[str, int] = {}
        self._server_of: list[str] = []
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def size(self, server: str) -> int:
        """Block hashes indexed for ``server``."""
        lru = self._lru.get(server)
        return len(lru) if lru else 0

    def add(self, block_hashes: Sequence[int], server: str) -> None:
        """Index ``block_hashes`` for ``server`` in order (the leading block becomes the
        least recent of them, as in ``indexer.Add``), evicting its oldest beyond capacity."""
        bit = self._bit_of.get(server)
        if bit is None:
            bit = self._bit_of[server] = 1 << len(self._server_of)
            self._server_of.append(server)
            self._lru[server] = OrderedDict()
        lru = self._lru[server]
        servers_of = self._servers_of
        for block in block_hashes:
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            servers_of[block] = servers_of.get(block, 0) | bit
            if len(lru) > self._capacity:
                evicted, _ = lru.popitem(last=False)
                remaining = servers_of[evicted] & ~bit
                if remaining:
                    servers_of[evicted] = remaining
                else:
                    del servers_of[evicted]

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """``matchLongestPrefix``: walk the blocks until one no server holds, crediting
        each server one per walked block it holds (servers with none are left out).

        Runs of blocks held by the same servers are credited at once, so a shared prefix
        costs O(blocks + servers), not O(blocks * servers).
        """
        credited: dict[str, int] = {}
        run_mask = 0
        run = 0
        get = self._servers_of.get
        for block in block_hashes:
            mask = get(block, 0)
            if not mask:
                break
            if mask == run_mask:
                run += 1
                continue
            if run:
                self._credit(credited, run_mask, run)
            run_mask, run = mask, 1
        if run:
            self._credit(credited, run_mask, run)
        return credited

    def _credit(self, credited: dict[str, int], mask: int, blocks: int) -> None:
        while mask:
            low = mask & -mask
            server = self._server_of[low.bit_length() - 1]
            credited[server] = credited.get(server, 0) + blocks
            mask ^= low
