"""The hint mirror's two lookups on the hot path, as walks over its index.

:class:`~firstlight.hints.HintMirror` keeps, per tier, an index of block hash → replica
id → last seen, and answers every routing decision from it without I/O:
:meth:`~firstlight.hints.HintMirror.longest_prefix` walks the device tier's index with
:func:`device_runs`, :meth:`~firstlight.hints.HintMirror.host_prefix` the host tier's
with :func:`host_runs`, from where each replica's device run ends. The mirror says what
its answers mean (expiry, tiers, who calls them); these functions walk, linear in the
chain's length and tuned for it (a fast path in C where every replica still matches).
Pure and synchronous: ``clock`` is the mirror's injected clock, read once per lookup
and only when there is something to walk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import islice

__all__ = ["NEVER", "device_runs", "host_runs"]

NEVER = float("-inf")
"""The last-seen time of an entry the index does not hold (older than any cutoff)."""


def device_runs(
    holders_of: Mapping[int, dict[str, float]],
    block_hashes: Sequence[int],
    clock: Callable[[], float],
    ttl_s: float,
) -> dict[str, int]:
    """For each replica holding the chain's first block in ``holders_of`` (block hash →
    replica id → last seen; an entry last seen more than ``ttl_s`` seconds before
    ``clock()`` counts as absent), how many leading blocks of ``block_hashes`` it holds:
    the walk of :meth:`HintMirror.longest_prefix
    <firstlight.hints.HintMirror.longest_prefix>`. It stops as soon as no replica
    matches."""
    if not block_hashes:
        return {}
    first = holders_of.get(block_hashes[0])
    if not first:
        return {}
    cutoff = clock() - ttl_s
    active = {replica for replica, seen in first.items() if seen >= cutoff}
    counts: dict[str, int] = {}
    depth = 1
    for block_hash in islice(block_hashes, 1, None):
        if not active:
            break
        holders = holders_of.get(block_hash)
        if holders is None:
            break
        # Fast path, all in C: every still-matching replica holds this block and no
        # holder of it is expired. Otherwise filter replica by replica.
        if not (holders.keys() >= active and min(holders.values()) >= cutoff):
            fresh = {r for r in active if holders.get(r, NEVER) >= cutoff}
            for replica in active - fresh:
                counts[replica] = depth
            active = fresh
            if not active:
                break
        depth += 1
    for replica in active:
        counts[replica] = depth
    return counts


def host_runs(
    holders_of: Mapping[int, dict[str, float]],
    block_hashes: Sequence[int],
    device: Mapping[str, int],
    clock: Callable[[], float],
    ttl_s: float,
) -> dict[str, int]:
    """For each replica, how many blocks of ``block_hashes`` it holds in ``holders_of``
    (the host tier's index, not empty; an entry last seen more than ``ttl_s`` seconds
    before ``clock()`` counts as absent) in one run from where its device run ends: a
    replica in ``device`` starts at its device count, any other at the chain's first
    block (``block_hashes`` is not empty). The walk of :meth:`HintMirror.host_prefix
    <firstlight.hints.HintMirror.host_prefix>`: one pass down the chain, starting each
    replica's run at its block and ending it at the first block the replica lacks, and
    jumping to the next start while no run is open."""
    cutoff = clock() - ttl_s
    n = len(block_hashes)
    starts: dict[int, list[str]] = {}
    for replica, depth in device.items():
        if depth < n:
            starts.setdefault(depth, []).append(replica)
    first = holders_of.get(block_hashes[0])
    if first:
        starts.setdefault(0, []).extend(r for r in first if device.get(r, 0) == 0)
    pending = sorted(starts, reverse=True)
    counts: dict[str, int] = {}
    active: dict[str, int] = {}  # replica -> block its host run started at
    i = 0
    while i < n:
        if not active:
            if not pending:
                break
            i = pending[-1]
        holders = holders_of.get(block_hashes[i])
        if active:
            if holders is None:
                for replica, start in active.items():
                    counts[replica] = i - start
                active = {}
            else:
                for replica in [r for r in active if holders.get(r, NEVER) < cutoff]:
                    counts[replica] = i - active.pop(replica)
        if pending and pending[-1] == i:
            pending.pop()
            if holders is not None:
                for replica in starts[i]:
                    if holders.get(replica, NEVER) >= cutoff:
                        active[replica] = i
        i += 1
    for replica, start in active.items():
        counts[replica] = n - start
    return counts
