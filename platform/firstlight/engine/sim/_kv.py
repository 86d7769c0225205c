"""The simulator's KV-cache block pool and prefix cache, shaped like vLLM v1's.

``capacity`` physical blocks hold two kinds of content:

* *cached* blocks: full prompt blocks known by their hint-form hash. A cached block is
  *pinned* while a running request references it (reference count > 0) and otherwise
  sits in an LRU queue, still reusable by a later prefix hit, until evicted.
* *private* blocks: blocks a request is still filling (prompt chunks, its partial tail
  block, decode blocks), never shared.

``used = pinned + private`` is what requests hold (vLLM's ``kv_cache_usage``); evictable
cached blocks count as free. Allocating private blocks evicts from the LRU head until
``cached + private <= capacity``. As in vLLM (``KVCacheManager.free``), a finished
request releases its blocks tail first, so a shared leading prefix outlives the unique
tail that followed it.

Every change is recorded in hint form and handed out by :meth:`BlockPool.take_event`
as one :class:`~firstlight.engine.protocol.CacheEvent`; the core takes one when a step is
scheduled (the evictions that made room for it) and one when it finishes (the blocks it
filled), so replaying the events always yields the cache's contents.
Only :class:`~firstlight.engine.sim.SimCore` calls this; it is not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from firstlight.engine.protocol import CacheEvent

__all__ = ["BlockPool"]


class BlockPool:
    """Block accounting and the block-level LRU prefix cache of one simulated replica."""

    __slots__ = ("_lru", "_private", "_record", "_refs", "_removed", "_stored", "capacity")

    def __init__(self, capacity: int, *, record_events: bool = True) -> None:
        self.capacity = capacity
        # Cached block hash -> number of running requests referencing it.
        self._refs: dict[int, int] = {}
        # Unpinned cached blocks, least recently released first. An OrderedDict, not a
        # dict: popping a plain dict's first key repeatedly scans its deleted slots.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._private = 0
        self._record = record_events
        self._stored: list[int] = []
        self._removed: list[int] = []

    @property
    def used(self) -> int:
        """Blocks held by running requests (pinned cached + private)."""
        return len(self._refs) - len(self._lru) + self._private

    @property
    def cached(self) -> int:
        """Cached blocks, pinned or evictable."""
        return len(self._refs)

    def contents(self) -> frozenset[int]:
        """Hashes of every cached block (for tests and the ``cleared`` snapshot)."""
        return frozenset(self._refs)

    def is_pinned(self, block_hash: int) -> bool:
        """Whether a running request references the cached block ``block_hash``."""
        return self._refs.get(block_hash, 0) > 0

    def longest_prefix(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are cached."""
        refs = self._refs
        count = 0
        for block_hash in hashes:
            if count >= limit or block_hash not in refs:
                break
            count += 1
        return count

    def unpinned_among(self, hashes: Sequence[int], count: int) -> int:
        """How many of the first ``count`` (cached) blocks of ``hashes`` are unpinned:
        the blocks a prefix hit would move from free to used."""
        lru = self._lru
        return sum(1 for i in range(count) if hashes[i] in lru)

    def acquire(self, hashes: Sequence[int], count: int) -> None:
        """Reference the first ``count`` blocks of ``hashes`` (a prefix hit; all cached)."""
        refs, lru = self._refs, self._lru
        for i in range(count):
            block_hash = hashes[i]
            held = refs[block_hash]
            if held == 0:
                del lru[block_hash]
            refs[block_hash] = held + 1

    def allocate(self, blocks: int) -> None:
        """Give a request ``blocks`` private blocks, evicting LRU cached blocks as needed.

        The caller has checked ``used + blocks <= capacity`` (else it preempts or waits).
        """
        self._private += blocks
        excess = len(self._refs) + self._private - self.capacity
        if excess > 0:
            refs, lru = self._refs, self._lru
            for _ in range(excess):
                block_hash = lru.popitem(last=False)[0]
                del refs[block_hash]
                if self._record:
                    self._removed.append(block_hash)

    def commit(self, block_hash: int) -> None:
        """A private block just became a full prompt block with hash ``block_hash``: it
        joins the cache pinned by its request. If another request cached the same block
        meanwhile, the request references that one and frees its duplicate."""
        self._private -= 1
        held = self._refs.get(block_hash)
        if held is None:
            self._refs[block_hash] = 1
            if self._record:
                self._stored.append(block_hash)
        else:
            if held == 0:
                del self._lru[block_hash]
            self._refs[block_hash] = held + 1

    def release(self, hashes: Sequence[int], private: int) -> None:
        """A request finished, was aborted or preempted: drop its references (tail first,
        into the LRU queue when unpinned) and free its ``private`` blocks."""
        refs, lru = self._refs, self._lru
        for block_hash in reversed(hashes):
            held = refs[block_hash] - 1
            refs[block_hash] = held
            if held == 0:
                lru[block_hash] = None
        self._private -= private

    def take_event(self) -> CacheEvent | None:
        """The changes since the last call as one event, or ``None`` if nothing changed."""
        if not (self._stored or self._removed):
            return None
        event = CacheEvent(stored=tuple(self._stored), removed=tuple(self._removed))
        self._stored.clear()
        self._removed.clear()
        return event
