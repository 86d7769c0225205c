"""vLLM's KV-cache events, told apart by medium, as the two tiers the router knows.

With KV offloading (``vllm.kv_offloading_gib``) vLLM emits events for two media: its
block pool's (``medium`` ``"GPU"``, or ``None`` from older builds) and the offloading
manager's host memory (``"CPU"``). The offloading manager writes blocks through to host
memory as they are computed, so a block is often held in both; the router's mirror keeps
a block in one tier, the best one (:class:`~firstlight.hints.BlockEvent`: ``stored`` is
the device tier, ``offloaded`` the host tier only). :class:`KvTiers` keeps which blocks
each medium holds and translates:

* device store → ``stored``;
* device eviction of a block host memory holds → ``offloaded``, of one it does not →
  ``removed``;
* host store of a block no longer on the device → ``offloaded`` (on the device: nothing
  to tell, the mirror keeps it in the better tier);
* host eviction of a block not on the device → ``offload_removed`` (on the device:
  nothing);
* ``AllBlocksCleared`` → ``cleared``, and both sets emptied.

Events of other media (a disk or remote store) are ignored: the router does not price
them. vLLM publishes its events over ZMQ PUB/SUB, which drops messages silently (a slow
subscriber, a subscription made after the first batches); each batch carries a sequence
number from 0, and :class:`BatchSequence` tells the adapter when one went missing: it
then clears the replica's hints (:meth:`KvTiers.cleared`), so the router prices that
replica on load alone until new stores arrive, rather than trusting blocks it may have
evicted. Called by :meth:`~firstlight.engine.vllm_engine.VllmEngine.cache_events` for every
event it decodes; pure and synchronous. Memory: one set entry per block held, bounded by
the two tiers' capacities.
"""

from __future__ import annotations

from collections.abc import Iterable

from firstlight.engine.protocol import CacheEvent

__all__ = ["DEVICE_MEDIA", "HOST_MEDIUM", "BatchSequence", "KvTiers"]

DEVICE_MEDIA = frozenset({None, "GPU"})
"""The block pool's media: vLLM names its own pool ``GPU`` on every device, CPU included."""
HOST_MEDIUM = "CPU"
"""The offloading manager's host memory."""


class KvTiers:
    """Which blocks (hint form) each tier holds, and the events that keep a mirror so."""

    __slots__ = ("_device", "_host")

    def __init__(self) -> None:
        self._device: set[int] = set()
        self._host: set[int] = set()

    def stored(self, blocks: Iterable[int], medium: str | None) -> CacheEvent | None:
        """Blocks stored in ``medium``; the event to publish, or ``None``."""
        if medium in DEVICE_MEDIA:
            stored = tuple(blocks)
            self._device.update(stored)
            return CacheEvent(stored=stored) if stored else None
        if medium == HOST_MEDIUM:
            moved = []
            for block in blocks:
                self._host.add(block)
                if block not in self._device:
                    moved.append(block)
            return CacheEvent(offloaded=tuple(moved)) if moved else None
        return None

    def removed(self, blocks: Iterable[int], medium: str | None) -> CacheEvent | None:
        """Blocks evicted from ``medium``; the event to publish, or ``None``."""
        if medium in DEVICE_MEDIA:
            gone: list[int] = []
            moved: list[int] = []
            for block in blocks:
                self._device.discard(block)
                (moved if block in self._host else gone).append(block)
            if not (gone or moved):
                return None
            return CacheEvent(removed=tuple(gone), offloaded=tuple(moved))
        if medium == HOST_MEDIUM:
            dropped = []
            for block in blocks:
                self._host.discard(block)
                if block not in self._device:
                    dropped.append(block)
            return CacheEvent(offload_removed=tuple(dropped)) if dropped else None
        return None

    def cleared(self) -> CacheEvent:
        """Every block of every tier dropped (vLLM's ``AllBlocksCleared``)."""
        self._device.clear()
        self._host.clear()
        return CacheEvent(cleared=True)


class BatchSequence:
    """The sequence numbers of one publisher's event batches: 0, 1, 2, ..."""

    __slots__ = ("_next", "gaps")

    def __init__(self) -> None:
        self._next = 0
        self.gaps = 0
        """Batches found missing so far (each a run of one or more)."""

    @property
    def expected(self) -> int:
        """The sequence number the next batch should carry."""
        return self._next

    def follows(self, seq: int) -> bool:
        """Whether batch ``seq`` is the one expected (the first must be 0); a gap is
        counted, and the sequence goes on from ``seq``."""
        expected, self._next = self._next, seq + 1
        if seq == expected:
            return True
        self.gaps += 1
        return False
