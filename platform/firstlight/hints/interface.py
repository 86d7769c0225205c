"""The hints subsystem's contracts, for the code on either side of it.

Routers depend on :class:`PrefixHintSource` (implemented by
:class:`~firstlight.hints.HintMirror`), engine-side bridges on :class:`BlockEventSink`
(implemented by :class:`~firstlight.hints.HintPublisher`); tests of those callers pass
small fakes instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from firstlight.hints._events import BlockEvent

__all__ = ["BlockEventSink", "PrefixHintSource"]


class PrefixHintSource(Protocol):
    """Answers which replicas hold a prompt's leading KV-cache blocks (in their device
    tier; the host tier of KV offloading is asked separately, through
    :meth:`~firstlight.hints.HintMirror.host_prefix`, which the routing layer's
    ``TieredCacheView`` names)."""

    def longest_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For each replica holding the chain's first block, how many leading blocks it
        holds. Called by the router once per request, on the hot path: synchronous, no
        I/O, linear in ``len(block_hashes)``, never raises."""
        ...


class BlockEventSink(Protocol):
    """Receives one replica's batches of KV-cache changes."""

    async def publish(self, event: BlockEvent) -> None:
        """Record one batch. Called by the engine's KV-event bridge for every batch;
        may raise :class:`~firstlight.errors.HintsError` subclasses, which the bridge
        logs and counts (a lost batch only makes hints less precise)."""
        ...
