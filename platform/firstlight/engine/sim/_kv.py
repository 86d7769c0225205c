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

**Host tier** (vLLM's KV offloading, ``host_capacity`` blocks, 0 = off): a cached block
evicted from the device is kept in host memory instead of dropped, in its own LRU
order (the oldest offloaded block goes first when the host tier is full). A prefix hit
that runs on into host-tier blocks reloads them (:meth:`BlockPool.reload`): they leave
the host tier and become device blocks again, and the core charges their reload time
(the profile's ``reload_ms_per_token``) instead of their prefill. vLLM reuses a prefix
as one chain — device blocks, then host blocks, then recomputation — and so does this.

Every change is recorded in hint form and handed out by :meth:`BlockPool.take_event`
as one :class:`~firstlight.engine.protocol.CacheEvent` (a :class:`SimCacheEvent` when the
host tier changed); the core takes one when a step is scheduled (the evictions and
reloads that made room for it) and one when it finishes (the blocks it filled), so
replaying the events always yields the cache's contents, tier by tier.
Only :class:`~firstlight.engine.sim.SimCore` calls this; it is not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from firstlight.engine.protocol import CacheEvent

__all__ = ["BlockPool", "SimCacheEvent"]


@dataclass(frozen=True, slots=True)
class SimCacheEvent(CacheEvent):
    """A :class:`~firstlight.engine.protocol.CacheEvent` whose host-tier fields
    (``offloaded``, ``offload_removed``) changed: emitted by the simulator only when its
    host tier changed (otherwise a plain ``CacheEvent``), so tests and the benchmark can
    tell the two apart. The ModelServer and the benchmark's hint feed pass the fields on
    to the mirror alike."""


class BlockPool:
    """Block accounting and the block-level LRU prefix cache of one simulated replica,
    with an optional host tier of ``host_capacity`` blocks."""

    __slots__ = (
        "_dropped",
        "_host",
        "_lru",
        "_offloaded",
        "_private",
        "_record",
        "_refs",
        "_removed",
        "_stored",
        "capacity",
        "host_capacity",
    )

    def __init__(
        self, capacity: int, *, record_events: bool = True, host_capacity: int = 0
    ) -> None:
        self.capacity = capacity
        self.host_capacity = host_capacity
        # Host-tier blocks, least recently offloaded first.
        self._host: OrderedDict[int, None] = OrderedDict()
        self._offloaded: list[int] = []
        self._dropped: list[int] = []
        # Cached block hash -> number of running requests referencing it.
        self._refs: dict[int, int] = {}
        # Unpinned cached blocks, least recently released first. An OrderedDict, not a
        # dict: popping a plain dict's first key repeatedly scans its deleted slots.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._private = 0
        self._record = record_events
        self._stored: list[int] = []
        self._removed: list[int] = []

    def __deepcopy__(self, memo: dict[int, object]) -> BlockPool:
        """A copy for the benchmark's hindsight forks: every table holds ints, so each is
        copied as a whole, not item by item."""
        pool = BlockPool.__new__(BlockPool)
        memo[id(self)] = pool
        pool.capacity, pool.host_capacity = self.capacity, self.host_capacity
        pool._private, pool._record = self._private, self._record
        pool._host, pool._lru, pool._refs = self._host.copy(), self._lru.copy(), dict(self._refs)
        pool._offloaded, pool._dropped = list(self._offloaded), list(self._dropped)
        pool._stored, pool._removed = list(self._stored), list(self._removed)
        return pool

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

    def host_contents(self) -> frozenset[int]:
        """Hashes of every host-tier block (for tests and the ``cleared`` snapshot)."""
        return frozenset(self._host)

    @property
    def host_cached(self) -> int:
        """Blocks held in the host tier."""
        return len(self._host)

    def host_prefix(self, hashes: Sequence[int], start: int, limit: int) -> int:
        """How many blocks of ``hashes`` from index ``start`` on (up to index ``limit``)
        are in the host tier: the run a prefix hit reloads after its ``start`` device
        blocks."""
        host = self._host
        if not host:
            return 0
        count = 0
        for i in range(start, min(limit, len(hashes))):
            if hashes[i] not in host:
                break
            count += 1
        return count

    def reload(self, hashes: Sequence[int], start: int, count: int) -> None:
        """Take blocks ``start .. start + count`` of ``hashes`` out of the host tier: a
        prefix hit reloads them (all in it). The caller allocates their device blocks and
        commits them (:meth:`commit`), which announces them stored (a device block again)."""
        host = self._host
        for i in range(start, start + count):
            del host[hashes[i]]

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
        for _ in range(len(self._refs) + self._private - self.capacity):
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        """Evict the least recently used unpinned block (to the host tier, if any)."""
        block_hash = self._lru.popitem(last=False)[0]
        del self._refs[block_hash]
        if self.host_capacity:
            self._offload(block_hash)
        elif self._record:
            self._removed.append(block_hash)

    def _offload(self, block_hash: int) -> None:
        """An evicted device block goes to the host tier, whose oldest block makes room."""
        host = self._host
        host[block_hash] = None
        if self._record:
            self._offloaded.append(block_hash)
        if len(host) > self.host_capacity:
            dropped = host.popitem(last=False)[0]
            if self._record:
                self._dropped.append(dropped)

    def commit(self, block_hash: int) -> None:
        """A private block just became a full prompt block with hash ``block_hash``: it
        joins the cache pinned by its request. If another request cached the same block
        meanwhile, the request references that one and frees its duplicate."""
        self._private -= 1
        held = self._refs.get(block_hash)
        if held is None and self._host:
            # Recomputed while a copy sat in host memory: the device copy supersedes it.
            self._host.pop(block_hash, None)
        if held is None:
            self._refs[block_hash] = 1
            if self._record:
                self._stored.append(block_hash)
        else:
            if held == 0:
                del self._lru[block_hash]
            self._refs[block_hash] = held + 1

    def receive(self, hashes: Sequence[int]) -> int:
        """Blocks written into the cache from elsewhere (a prefix's KV pulled from another
        site): the leading blocks of ``hashes`` not cached yet join it unpinned, most
        recently used, each evicting the least recently used block when the pool is full;
        it stops at the first block there is no room for (every other block held by a
        request). Returns how many leading blocks of ``hashes`` are cached afterwards."""
        refs, lru = self._refs, self._lru
        count = 0
        for block_hash in hashes:
            if block_hash in refs:
                if block_hash in lru:
                    lru.move_to_end(block_hash)
                count += 1
                continue
            if len(refs) + self._private >= self.capacity:
                if not lru:
                    break
                self._evict_oldest()
            self._host.pop(block_hash, None)
            refs[block_hash] = 0
            lru[block_hash] = None
            if self._record:
                self._stored.append(block_hash)
            count += 1
        return count

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
        """The changes since the last call as one event (a :class:`SimCacheEvent` when the
        host tier changed), or ``None`` if nothing changed."""
        if not (self._stored or self._removed or self._offloaded or self._dropped):
            return None
        event: CacheEvent
        if self._offloaded or self._dropped:
            # A block offloaded and then dropped from the host tier within one event is
            # in both lists: applied in that order, it ends up gone, as it is.
            event = SimCacheEvent(
                stored=tuple(self._stored),
                removed=tuple(self._removed),
                offloaded=tuple(self._offloaded),
                offload_removed=tuple(self._dropped),
            )
            self._offloaded.clear()
            self._dropped.clear()
        else:
            event = CacheEvent(stored=tuple(self._stored), removed=tuple(self._removed))
        self._stored.clear()
        self._removed.clear()
        return event
