"""The in-memory mirror of which replica holds which KV-cache block, for one model.

Routers read it on the hot path (:meth:`HintMirror.longest_prefix`, pure and
synchronous, linear in the prompt's block count); a
:class:`~firstlight.hints.HintSubscriber` keeps it in sync with Redis by calling
:meth:`HintMirror.apply`, :meth:`HintMirror.load_snapshot` and :meth:`HintMirror.prune`.
Nothing here does I/O.

The mirror is a cache: an entry not refreshed for ``ttl_s`` seconds (by the injected
clock) is absent from lookups at once and its memory is reclaimed by :meth:`prune`. It is
not thread-safe: use it from the thread of the event loop that runs its subscriber.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from firstlight.errors import HintsError
from firstlight.hints._events import BlockEvent, ReplicaSnapshot

__all__ = ["HintMirror", "MirrorStats"]

_NEVER = float("-inf")


@dataclass(frozen=True, slots=True)
class MirrorStats:
    """A snapshot of a mirror's counters, for metrics and logs."""

    entries: int
    """(replica, block) entries held, including expired ones not yet pruned."""
    replicas: int
    """Replicas holding at least one entry."""
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
        if not block_hashes:
            return {}
        first = self._holders.get(block_hashes[0])
        if not first:
            return {}
        cutoff = self._clock() - self._ttl_s
        active = {replica for replica, seen in first.items() if seen >= cutoff}
        counts: dict[str, int] = {}
        depth = 1
        holders_of = self._holders
        for block_hash in islice(block_hashes, 1, None):
            if not active:
                break
            holders = holders_of.get(block_hash)
            if holders is None:
                break
            # Fast path, all in C: every still-matching replica holds this block and no
            # holder of it is expired. Otherwise filter replica by replica.
            if not (holders.keys() >= active and min(holders.values()) >= cutoff):
                fresh = {r for r in active if holders.get(r, _NEVER) >= cutoff}
                for replica in active - fresh:
                    counts[replica] = depth
                active = fresh
                if not active:
                    break
            depth += 1
        for replica in active:
            counts[replica] = depth
        return counts

    # --- updates -----------------------------------------------------------------------

    def apply(self, event: BlockEvent, *, age_s: float = 0.0) -> None:
        """Apply one batch of a replica's changes: an older epoch than the replica's known
        one is ignored (and counted); a newer epoch first drops all the replica's blocks;
        then ``cleared``, ``removed`` and ``stored`` apply in that order. Stored blocks are
        stamped ``clock() - age_s`` (``age_s`` is how long ago the batch was published;
        a batch older than ``ttl_s`` stores nothing).

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
        if event.stored and age_s <= self._ttl_s:
            seen = now - max(age_s, 0.0)
            self._store(replica, ((block_hash, seen) for block_hash in event.stored))

    def load_snapshot(self, snapshot: Mapping[str, ReplicaSnapshot]) -> None:
        """Replace the mirror's content with ``snapshot`` (replica id -> what Redis holds):
        replicas absent from it are dropped, every other replica's blocks are replaced. A
        snapshot older than the replica's known epoch is ignored (and counted), and the
        replica's blocks are dropped since Redis no longer vouches for them.

        Called by the subscriber when it (re)bootstraps from Redis. Never raises.
        """
        for replica in [r for r in self._blocks_of if r not in snapshot]:
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
        self._last_event_at = now

    def drop_replica(self, replica_id: str) -> int:
        """Forget every block of ``replica_id`` (e.g. the replica was removed from the
        deployment); return how many entries were dropped. Its epoch stays known, so late
        events of older epochs are still ignored.

        Called by the routing layer's replica tracking. Never raises.
        """
        return self._drop_blocks(replica_id)

    def prune(self, budget: int | None = None) -> int:
        """Remove expired entries; return how many were removed.

        With ``budget=None`` every block is checked (time linear in the mirror's size).
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
        return removed

    def record_malformed(self, count: int = 1) -> None:
        """Count feed entries or Redis members a subscriber skipped (shown in :attr:`stats`)."""
        self._malformed_skipped += count

    # --- inspection --------------------------------------------------------------------

    def replicas(self) -> set[str]:
        """Replicas holding at least one entry (expired entries count until pruned)."""
        return set(self._blocks_of)

    def epoch_of(self, replica_id: str) -> int | None:
        """The newest epoch seen for ``replica_id``, or ``None`` if it was never seen."""
        return self._epochs.get(replica_id)

    def __len__(self) -> int:
        """Number of (replica, block) entries, including expired ones not yet pruned."""
        return sum(len(blocks) for blocks in self._blocks_of.values())

    @property
    def stats(self) -> MirrorStats:
        """A snapshot of the counters (O(replicas))."""
        return MirrorStats(
            entries=len(self),
            replicas=len(self._blocks_of),
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
            elif holders.get(replica, _NEVER) < seen:
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
        blocks = self._blocks_of.pop(replica, None)
        if not blocks:
            return 0
        for block_hash in blocks:
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.pop(replica, None)
                if not holders:
                    del self._holders[block_hash]
        return len(blocks)
