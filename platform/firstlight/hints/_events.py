"""The data that flows through the hints subsystem: block events and replica snapshots.

A :class:`BlockEvent` is one batch of a replica's KV-cache changes, built by the engine's
KV-event bridge from vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
events and handed to :meth:`~firstlight.hints.HintPublisher.publish`; subscribers decode
the same events from the Redis feed and apply them to a
:class:`~firstlight.hints.HintMirror`. A :class:`ReplicaSnapshot` is what a subscriber
reads from Redis when it bootstraps.

Blocks live in one of two tiers of a replica: the *device* tier (GPU memory, or the
CPU engine's KV cache) and, with KV offloading (``models[].vllm.kv_offloading_gib``), the
*host* tier: blocks evicted from the device and copied to host memory, which a later
prefix hit reloads instead of recomputing. ``stored`` and ``removed`` are device-tier
changes, ``offloaded`` and ``offload_removed`` host-tier ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from firstlight.errors import InvalidBlockEventError

__all__ = ["MAX_BLOCK_HASH", "BlockEvent", "ReplicaSnapshot"]

MAX_BLOCK_HASH = 2**64 - 1
"""Largest block hash: hashes are the low 64 bits of vLLM's ``sha256_cbor`` block hashes,
as unsigned integers."""


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """One batch of KV-cache changes of one replica.

    Applied in this order: ``cleared`` (drop every block of the replica, in both tiers),
    then ``removed`` (gone from the device tier), ``offloaded`` (gone from the device
    tier, now held in the host tier), ``offload_removed`` (gone from the host tier), and
    last ``stored`` (held in the device tier, and no longer in the host tier: a reloaded
    or recomputed block is a device block again). A batch builder that saw a block go
    through several of these should name it once, in the tuple of its final state, so the
    tuples are disjoint in practice.

    Raises :class:`InvalidBlockEventError` when the replica id is empty, the epoch is
    negative, or a hash is outside ``[0, 2**64)``.
    """

    replica_id: str
    """Replica that holds the blocks, e.g. ``"us-east/SmolLM2/replica-3"``."""
    epoch: int
    """Incarnation of the replica's engine; bumped on every restart. Events of an older
    epoch than the newest one seen are stale and ignored."""
    stored: tuple[int, ...]
    """Block hashes the replica now holds (new or refreshed)."""
    removed: tuple[int, ...]
    """Block hashes the replica evicted."""
    cleared: bool = False
    """The replica dropped all its blocks (vLLM's ``AllBlocksCleared``, or a new epoch)."""
    offloaded: tuple[int, ...] = ()
    """Block hashes that left the device tier and are held in the host tier (KV
    offloading); a prefix hit on them costs a reload, not a recompute."""
    offload_removed: tuple[int, ...] = ()
    """Block hashes the replica dropped from its host tier (evicted there too)."""

    def __post_init__(self) -> None:
        if not isinstance(self.replica_id, str) or not self.replica_id:
            raise InvalidBlockEventError(
                f"replica_id = {self.replica_id!r}: must be a non-empty string"
            )
        if type(self.epoch) is not int or self.epoch < 0:
            raise InvalidBlockEventError(
                f"epoch = {self.epoch!r}: must be a non-negative integer "
                f"(replica {self.replica_id!r})"
            )
        _check_hashes("stored", self.stored, self.replica_id)
        _check_hashes("removed", self.removed, self.replica_id)
        _check_hashes("offloaded", self.offloaded, self.replica_id)
        _check_hashes("offload_removed", self.offload_removed, self.replica_id)


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """What Redis holds for one replica when a subscriber bootstraps.

    Built by the subscriber and passed to :meth:`~firstlight.hints.HintMirror.load_snapshot`.
    """

    epoch: int
    """The replica's current epoch."""
    blocks: Sequence[tuple[int, float]]
    """``(block hash, age in seconds)`` of every block the replica holds in its device
    tier; the age is how long ago the block was last seen stored."""
    offloaded: Sequence[tuple[int, float]] = ()
    """``(block hash, age in seconds)`` of every block the replica holds in its host tier
    (KV offloading); the age is how long ago the block was last seen offloaded."""


def _check_hashes(field: str, hashes: tuple[int, ...], replica_id: str) -> None:
    if not isinstance(hashes, tuple):
        raise InvalidBlockEventError(
            f"{field} = {hashes!r}: must be a tuple of block hashes (replica {replica_id!r})"
        )
    for value in hashes:
        if type(value) is not int or not 0 <= value <= MAX_BLOCK_HASH:
            raise InvalidBlockEventError(
                f"{field} contains {value!r}: block hashes are integers in [0, 2**64) "
                f"(replica {replica_id!r})"
            )
