"""The approximate multi-tenant prefix tree of the SGLang and Ray Serve routers.

Both peers keep one tree of the prompts they routed, shared by all replicas ("tenants"):
each node records which tenants were sent that prefix, a tenant's size is the number of
nodes it holds, and eviction removes a tenant's least recently used *leaves* first (see
``sgl-router/src/policies/tree.rs`` and ``ray/llm/_internal/serve/request_router/
prefix_aware/prefix_tree.py``). They key nodes by characters; here a node is one block,
keyed by its 64-bit hash under its parent (the request's ``block_hashes``, leading block
first), so sizes count blocks.

Invariant: a tenant on a node is on all its ancestors (inserts touch the whole path and
eviction only removes a tenant's leaves). Hence along a request's path the tenant sets
only shrink, a tenant's match is the depth of the deepest path node it is on, and one
upward pass over the path finds every tenant's match in O(blocks + tenants). Tenant sets
are bit masks (one bit per tenant) to keep that pass cheap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["ApproxPrefixTree"]


class _Node:
    __slots__ = ("children", "key", "parent", "tenants")

    def __init__(self, key: int, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] | None = None
        self.tenants = 0
        """Bit mask of the tenants this prefix was routed to."""


class ApproxPrefixTree:
    """Which replica was sent which block prefix, with per-replica LRU eviction.

    Used by the ``cache_aware`` and ``prefix_affinity`` policies: :meth:`match` in
    ``choose``, :meth:`insert` and :meth:`evict` in ``on_routed``.
    """

    def __init__(self) -> None:
        self._root = _Node(0, None)
        self._bit_of: dict[str, int] = {}
        self._tenant_of: list[str] = []
        # Per tenant: its nodes, least recently used first, with the insertion that last
        # touched them. Inserts touch a path deepest first, so a node is always older
        # than its ancestors and the oldest node is one of the tenant's leaves.
        self._lru: dict[str, OrderedDict[_Node, int]] = {}
        self._insertions = 0

    def size(self, tenant: str) -> int:
        """Blocks (nodes) held by ``tenant``; 0 for a tenant never routed to."""
        nodes = self._lru.get(tenant)
        return len(nodes) if nodes else 0

    def tenants(self) -> list[str]:
        """Every tenant that was ever routed to."""
        return list(self._tenant_of)

    def insert(self, block_hashes: Sequence[int], tenant: str) -> None:
        """Record that the prefix ``block_hashes`` was routed to ``tenant``."""
        bit = self._bit_of.get(tenant)
        if bit is None:
            bit = self._bit_of[tenant] = 1 << len(self._tenant_of)
            self._tenant_of.append(tenant)
            self._lru[tenant] = OrderedDict()
        lru = self._lru[tenant]
        self._insertions += 1
        insertion = self._insertions
        path: list[_Node] = []
        node = self._root
        for block in block_hashes:
            if node.children is None:
                node.children = {}
            child = node.children.get(block)
            if child is None:
                child = node.children[block] = _Node(block, node)
            child.tenants |= bit
            path.append(child)
            node = child
        for node in reversed(path):
            lru[node] = insertion
            lru.move_to_end(node)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``block_hashes`` in each tenant's tree (tenants with none are
        left out). Read-only."""
        masks: list[int] = []
        node = self._root
        for block in block_hashes:
            children = node.children
            child = children.get(block) if children is not None else None
            if child is None:
                break
            masks.append(child.tenants)
            node = child
        matched: dict[str, int] = {}
        seen = 0
        for depth in range(len(masks), 0, -1):
            mask = masks[depth - 1]
            if mask != seen:
                new = mask & ~seen
                while new:
                    low = new & -new
                    matched[self._tenant_of[low.bit_length() - 1]] = depth
                    new ^= low
                seen = mask
        return matched

    def evict(self, tenant: str, target_size: int, *, whole_insertions: bool = False) -> int:
        """Drop ``tenant``'s least recently used leaves until it holds ``target_size``
        blocks or fewer; return how many were dropped.

        ``whole_insertions`` also drops every other node last touched by the same
        insertion as the last one dropped (Ray evicts all nodes sharing the oldest
        timestamp together, and one routed prompt shares one timestamp).
        """
        lru = self._lru.get(tenant)
        if not lru:
            return 0
        bit = self._bit_of[tenant]
        dropped = 0
        while lru and len(lru) > target_size:
            node, insertion = lru.popitem(last=False)
            self._detach(node, bit)
            dropped += 1
            while whole_insertions and lru:
                oldest = next(iter(lru))
                if lru[oldest] != insertion:
                    break
                del lru[oldest]
                self._detach(oldest, bit)
                dropped += 1
        return dropped

    @staticmethod
    def _detach(node: _Node, bit: int) -> None:
        node.tenants &= ~bit
        # A node no tenant holds has no children either (see the invariant).
        if not node.tenants and node.parent is not None and node.parent.children is not None:
            del node.parent.children[node.key]
