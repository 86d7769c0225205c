"""The in-memory mirror of which replica holds which KV-cache block, for one model.

Routers read it on the hot path (:meth:`HintMirror.longest_prefix`, pure and
synchronous, linear in the prompt's block count); a
:class:`~firstlight.hints.HintSubscriber` keeps it in sync with Redis by calling
:meth:`HintMirror.apply`, :meth:`HintMirror.load_snapshot` and :meth:`HintMirror.prune`.
Nothing here does I/O. The walks the two lookups make over the index are in
:mod:`firstlight.hints._lookups`.

The mirror is a cache: an entry not refreshed for ``ttl_s`` seconds (by the injected
clock) is absent from lookups at once and its memory is reclaimed by :meth:`prune`. It is
not thread-safe: use it from the thread of the event loop that runs its subscriber.

**Tiers.** With KV offloading a replica holds blocks in two tiers: its device memory and
host memory (blocks the device evicted, reloaded on a prefix hit instead of recomputed).
vLLM reuses a prefix as one chain — device blocks, then host blocks reloaded, then the
rest recomputed — so a lookup has two steps: :meth:`HintMirror.longest_prefix` (device
tier, what every policy reads, unchanged) and :meth:`HintMirror.host_prefix` (how many
further leading blocks each replica holds in its host tier right after its device run),
or both at once with :meth:`HintMirror.tiered_prefix`. The host tier is a second,
private mirror of the same class inside this one, created by the first host-tier
change, so a model without offloading pays nothing for it: ``offloaded`` moves a block
from the device mirror to the host mirror, ``stored`` moves it back, ``offload_removed``
drops it from the host mirror; epochs, ``cleared``, snapshots, expiry and pruning apply
to both.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from firstlight.errors import HintsError
from firstlight.hints._events import BlockEvent, ReplicaSnapshot
from firstlight.hints._lookups import NEVER, device_runs, host_runs

__all__ = ["HintMirror", "MirrorStats"]


@dataclass(frozen=True, slots=True)
class MirrorStats:
    """A snapshot of a mirror's counters, for metrics and logs."""

    entries: int
    """(replica, block) entries held, of both tiers, including expired ones not yet
    pruned."""
    replicas: int
    """Replicas holding at least one entry (in either tier)."""
    ignored_stale_epoch: int
    """Events and snapshots dropped because their epoch was older than the replica's."""
    malformed_skipped: int
    """Feed entries and Redis members a subscriber could not decode and skipped."""
    last_event_at: float | None
    """Mirror-clock time of the last applied event or snapshot; ``None`` before any."""


class HintMirror:
    """Which replica holds which block, with a per-entry last-seen time.

    ``ttl_s`` is how long an entry lives without being stored again; ``clock`` returns
    seconds (monotonic by default) and is injected so expiry is testable without sleeping.
    Raises :class:`HintsError` when ``ttl_s`` is not positive.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise HintsError(f"ttl_s = {ttl_s!r}: must be > 0")
        self._ttl_s = float(ttl_s)
        self._clock = clock
        # block hash -> {replica id -> last seen}: the lookup index.
        self._holders: dict[int, dict[str, float]] = {}
        # replica id -> its block hashes: makes dropping a replica O(its blocks).
        self._blocks_of: dict[str, set[int]] = {}
        self._epochs: dict[str, int] = {}
        # One shared string object per replica id: ids decoded from Redis are fresh
        # objects per event, and millions of dict keys would otherwise each hold a copy.
        self._names: dict[str, str] = {}
        self._prune_queue: list[int] = []
        self._ignored_stale_epoch = 0
        self._malformed_skipped = 0
        self._last_event_at: float | None = None
        # The host tier (KV offloading): created by the first host-tier change.
        self._host: HintMirror | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> HintMirror:
        """A copy for the benchmark's hindsight forks (``firstlight_bench.simulator.des``), table
        by table: block hashes, replica ids and times are immutable, so this is a
        hundred times faster than a generic deep copy of a large index. The clock is
        copied through ``memo``: a copied simulation's mirror reads that copy's clock."""
        mirror = HintMirror.__new__(HintMirror)
        memo[id(self)] = mirror
        mirror._ttl_s = self._ttl_s
        mirror._clock = copy.deepcopy(self._clock, memo)
        mirror._holders = {block: holders.copy() for block, holders in self._holders.items()}
        mirror._blocks_of = {rid: blocks.copy() for rid, blocks in self._blocks_of.items()}
        mirror._epochs = dict(self._epochs)
        mirror._names = dict(self._names)
        mirror._prune_queue = list(self._prune_queue)
        mirror._ignored_stale_epoch = self._ignored_stale_epoch
        mirror._malformed_skipped = self._malformed_skipped
        mirror._last_event_at = self._last_event_at
        mirror._host = copy.deepcopy(self._host, memo)
        return mirror

    @property
    def ttl_s(self) -> float:
        """Seconds an entry lives without being stored again."""
        return self._ttl_s

    # --- hot path ----------------------------------------------------------------------

    def longest_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For each replica holding the chain's first block, how many leading blocks of
        ``block_hashes`` it holds (unexpired). Replicas without the first block are absent.

        Called by routers for every request; time is linear in the chain length (it stops
        as soon as no replica matches). Never raises.
        """
        return device_runs(self._holders, block_hashes, self._clock, self._ttl_s)

    def host_prefix(self, block_hashes: Sequence[int], device: Mapping[str, int]) -> dict[str, int]:
        """For each replica, how many leading blocks of ``block_hashes`` it holds in its
        host tier (unexpired) right after its device-tier run: a replica in ``device``
        (:meth:`longest_prefix`'s answer) starts at its device count, any other replica at
        the chain's first block. Replicas with no such block are absent.

        Called by the ``firstlight`` policy once per request after :meth:`longest_prefix`;
        returns ``{}`` at once when no replica holds a host-tier block (no offloading), so
        the hot path costs nothing more then. Otherwise time is linear in the longest run
        walked. Never raises.
        """
        host = self._host
        if host is None or not host._holders or not block_hashes:
            return {}
        return host_runs(host._holders, block_hashes, device, self._clock, self._ttl_s)

    def tiered_prefix(self, block_hashes: Sequence[int]) -> dict[str, tuple[int, int]]:
        """For each replica holding any of the chain's leading blocks: ``(device blocks,
        host blocks right after them)`` — :meth:`longest_prefix` and :meth:`host_prefix`
        in one answer, for tools and tests. Never raises."""
        device = self.longest_prefix(block_hashes)
        host = self.host_prefix(block_hashes, device)
        return {r: (device.get(r, 0), host.get(r, 0)) for r in device.keys() | host.keys()}

    # --- updates -----------------------------------------------------------------------

    def apply(self, event: BlockEvent, *, age_s: float = 0.0) -> None:
        """Apply one batch of a replica's changes: an older epoch than the replica's known
        one is ignored (and counted); a newer epoch first drops all the replica's blocks;
        then ``cleared``, ``removed``, ``offloaded`` (device tier → host tier),
        ``offload_removed`` (out of the host tier) and ``stored`` (into the device tier,
        out of the host tier) apply in that order. Stored and offloaded blocks are stamped
        ``clock() - age_s`` (``age_s`` is how long ago the batch was published; a batch
        older than ``ttl_s`` stores nothing, though its blocks still leave their tiers).

        Called by the subscriber for each feed entry, and by tests. Never raises.
        """
        replica = self._names.setdefault(event.replica_id, event.replica_id)
        if not self._admit_epoch(replica, event.epoch):
            return
        now = self._clock()
        self._last_event_at = now
        if event.cleared:
            self._drop_blocks(replica)
        for block_hash in event.removed:
            self._remove(replica, block_hash)
        seen = now - max(age_s, 0.0)
        fresh = age_s <= self._ttl_s
        host = self._host
        if event.offloaded or event.offload_removed:
            if host is None:
                host = self._host = HintMirror(self._ttl_s, self._clock)
            for block_hash in event.offloaded:
                self._remove(replica, block_hash)
            if fresh:
                host._store(replica, ((block_hash, seen) for block_hash in event.offloaded))
            for block_hash in event.offload_removed:
                host._remove(replica, block_hash)
        if host is not None and event.stored and replica in host._blocks_of:
            for block_hash in event.stored:
                host._remove(replica, block_hash)
        if event.stored and fresh:
            self._store(replica, ((block_hash, seen) for block_hash in event.stored))

    def load_snapshot(self, snapshot: Mapping[str, ReplicaSnapshot]) -> None:
        """Replace the mirror's content with ``snapshot`` (replica id -> what Redis holds):
        replicas absent from it are dropped, every other replica's blocks (both tiers)
        are replaced. A
        snapshot older than the replica's known epoch is ignored (and counted), and the
        replica's blocks are dropped since Redis no longer vouches for them.

        Called by the subscriber when it (re)bootstraps from Redis. Never raises.
        """
        for replica in [r for r in self.replicas() if r not in snapshot]:
            self._drop_blocks(replica)
        now = self._clock()
        for replica_id, replica_snapshot in snapshot.items():
            replica = self._names.setdefault(replica_id, replica_id)
            self._drop_blocks(replica)
            if not self._admit_epoch(replica, replica_snapshot.epoch):
                continue
            self._store(
                replica,
                (
                    (block_hash, now - max(age_s, 0.0))
                    for block_hash, age_s in replica_snapshot.blocks
                    if age_s <= self._ttl_s
                ),
            )
            if replica_snapshot.offloaded:
                if self._host is None:
                    self._host = HintMirror(self._ttl_s, self._clock)
                self._host._store(
                    replica,
                    (
                        (block_hash, now - max(age_s, 0.0))
                        for block_hash, age_s in replica_snapshot.offloaded
                        if age_s <= self._ttl_s
                    ),
                )
        self._last_event_at = now

    def drop_replica(self, replica_id: str) -> int:
        """Forget every block of ``replica_id``, in both tiers (e.g. the replica was
        removed from the deployment); return how many entries were dropped. Its epoch
        stays known, so late events of older epochs are still ignored.

        Called by the routing layer's replica tracking. Never raises.
        """
        return self._drop_blocks(replica_id)

    def prune(self, budget: int | None = None) -> int:
        """Remove expired entries (of both tiers); return how many were removed.

        With ``budget=None`` every block is checked (time linear in the mirror's size).
        The host tier, when there is one, is pruned with the same budget after the
        device tier.
        With a budget, at most ``budget`` blocks are checked per call, continuing a pass
        over the blocks present when the pass began, so a subscriber can reclaim memory
        in slices without stalling its event loop. Called periodically by the subscriber.
        """
        if budget is None:
            self._prune_queue = []
            batch: Iterable[int] = list(self._holders)
        else:
            if not self._prune_queue:
                self._prune_queue = list(self._holders)
            take = max(budget, 0)
            batch = self._prune_queue[-take:] if take else []
            del self._prune_queue[len(self._prune_queue) - len(batch) :]
        cutoff = self._clock() - self._ttl_s
        removed = 0
        for block_hash in batch:
            holders = self._holders.get(block_hash)
            if holders is None:
                continue
            for replica in [r for r, seen in holders.items() if seen < cutoff]:
                del holders[replica]
                self._forget_block_of(replica, block_hash)
                removed += 1
            if not holders:
                del self._holders[block_hash]
        if self._host is not None:
            removed += self._host.prune(budget)
        return removed

    def record_malformed(self, count: int = 1) -> None:
        """Count feed entries or Redis members a subscriber skipped (shown in :attr:`stats`)."""
        self._malformed_skipped += count

    # --- inspection --------------------------------------------------------------------

    def replicas(self) -> set[str]:
        """Replicas holding at least one entry in either tier (expired entries count
        until pruned)."""
        if self._host is None:
            return set(self._blocks_of)
        return set(self._blocks_of) | self._host._blocks_of.keys()

    def epoch_of(self, replica_id: str) -> int | None:
        """The newest epoch seen for ``replica_id``, or ``None`` if it was never seen."""
        return self._epochs.get(replica_id)

    def __len__(self) -> int:
        """Number of (replica, block, tier) entries, including expired ones not yet
        pruned."""
        held = sum(len(blocks) for blocks in self._blocks_of.values())
        return held + (len(self._host) if self._host is not None else 0)

    def host_entries(self) -> int:
        """Number of (replica, block) entries of the host tier (KV offloading),
        including expired ones not yet pruned."""
        return len(self._host) if self._host is not None else 0

    @property
    def stats(self) -> MirrorStats:
        """A snapshot of the counters (O(replicas))."""
        return MirrorStats(
            entries=len(self),
            replicas=len(self.replicas()),
            ignored_stale_epoch=self._ignored_stale_epoch,
            malformed_skipped=self._malformed_skipped,
            last_event_at=self._last_event_at,
        )

    # --- internals ---------------------------------------------------------------------

    def _admit_epoch(self, replica: str, epoch: int) -> bool:
        """Track the replica's epoch; False (and counted) when ``epoch`` is stale."""
        known = self._epochs.get(replica)
        if known is not None and epoch < known:
            self._ignored_stale_epoch += 1
            return False
        if known is not None and epoch > known:
            self._drop_blocks(replica)
        self._epochs[replica] = epoch
        return True

    def _store(self, replica: str, stamped: Iterable[tuple[int, float]]) -> None:
        """Record ``(block hash, last seen)`` pairs of ``replica``."""
        blocks = self._blocks_of.get(replica)
        for block_hash, seen in stamped:
            if blocks is None:
                blocks = self._blocks_of[replica] = set()
            holders = self._holders.get(block_hash)
            if holders is None:
                self._holders[block_hash] = {replica: seen}
            elif holders.get(replica, NEVER) < seen:
                # Keep the newest stamp: a replayed older batch must not age a block.
                holders[replica] = seen
            blocks.add(block_hash)

    def _remove(self, replica: str, block_hash: int) -> None:
        holders = self._holders.get(block_hash)
        if holders is None or holders.pop(replica, None) is None:
            return
        if not holders:
            del self._holders[block_hash]
        self._forget_block_of(replica, block_hash)

    def _forget_block_of(self, replica: str, block_hash: int) -> None:
        blocks = self._blocks_of.get(replica)
        if blocks is not None:
            blocks.discard(block_hash)
            if not blocks:
                del self._blocks_of[replica]

    def _drop_blocks(self, replica: str) -> int:
        dropped = self._host._drop_blocks(replica) if self._host is not None else 0
        blocks = self._blocks_of.pop(replica, None)
        if not blocks:
            return dropped
        for block_hash in blocks:
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.pop(replica, None)
                if not holders:
                    del self._holders[block_hash]
        return dropped + len(blocks)
