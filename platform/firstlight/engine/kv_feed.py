"""vLLM's KV-cache event stream, read from its ZMQ publisher, as the hint events the
router's mirror learns from.

:class:`KvEventFeed` subscribes to the engine's PUB socket (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared`` in msgpack batches with sequence numbers),
translates each event into a :class:`~firstlight.engine.protocol.CacheEvent` through
:class:`~firstlight.engine.kv_tiers.KvTiers`, and on a gap in the sequence asks vLLM's
replay socket for the lost batches, or clears the replica's hints when they are gone.
Made by :class:`~firstlight.engine.vllm_engine.VllmEngine` around the socket it
subscribed; its ``cache_events()`` is :meth:`KvEventFeed.events`. Tests build one over
a socket of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import msgspec
import zmq
import zmq.asyncio

from firstlight.engine.kv_tiers import BatchSequence, KvTiers
from firstlight.engine.protocol import CacheEvent
from firstlight.prefix import to_hint

__all__ = ["KvEventFeed"]

_log = logging.getLogger(__name__)

_HINT_MASK = (1 << 64) - 1
_REPLAY_TIMEOUT_S = 1.0
"""How long a gap waits for vLLM's replay socket before the hints are cleared instead."""


def _hint(block_hash: int | bytes) -> int:
    return to_hint(block_hash) if isinstance(block_hash, bytes) else block_hash & _HINT_MASK


class KvEventFeed:
    """One engine's KV event subscription: ``socket`` (a SUB socket subscribed to vLLM's
    publisher), ``name`` for the logs, ``replay_endpoint`` vLLM's replay socket for lost
    batches (``None``: a gap clears the hints)."""

    def __init__(
        self, socket: zmq.asyncio.Socket, name: str, replay_endpoint: str | None = None
    ) -> None:
        self._socket = socket
        self.name = name
        self.replay_endpoint = replay_endpoint

    async def events(self) -> AsyncIterator[CacheEvent]:
        """The events as hint-form :class:`CacheEvent` until the socket closes (one
        consumer); a lost batch is replayed, or the replica's hints are cleared."""
        from vllm.distributed.kv_events import (
            AllBlocksCleared,
            BlockRemoved,
            BlockStored,
            KVEventBatch,
        )

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        tiers = KvTiers()  # device and host tiers, from each event's medium

        def decoded(payload: bytes) -> Iterator[CacheEvent]:
            for event in decoder.decode(payload).events:
                out: CacheEvent | None = None
                if isinstance(event, BlockStored):
                    out = tiers.stored((_hint(h) for h in event.block_hashes), event.medium)
                elif isinstance(event, BlockRemoved):
                    out = tiers.removed((_hint(h) for h in event.block_hashes), event.medium)
                elif isinstance(event, AllBlocksCleared):
                    out = tiers.cleared()
                if out is not None:
                    yield out

        sequence = BatchSequence()
        while True:
            _topic, seq_bytes, payload = await self._socket.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq < 0:  # the publisher's end-of-stream marker
                continue
            expected = sequence.expected
            if not sequence.follows(seq):
                missed = await self._replayed(expected, seq) if expected < seq else None
                if missed is None:
                    _log.warning(
                        "%s: KV event batch %d arrived where %d was expected (events lost, "
                        "not replayed); the replica's hints are cleared until it stores "
                        "blocks again",
                        self.name,
                        seq,
                        expected,
                    )
                    yield tiers.cleared()
                else:
                    _log.info(
                        "%s: KV event batches %d-%d were lost and replayed",
                        self.name,
                        expected,
                        seq - 1,
                    )
                    for lost in missed:
                        for out in decoded(lost):
                            yield out
            for out in decoded(payload):
                yield out

    async def _replayed(self, first: int, end: int) -> list[bytes] | None:
        """Event batches ``first`` .. ``end - 1`` from vLLM's replay socket (a DEALER
        request with the first sequence number; the publisher answers with every batch
        it still buffers from there, then an end marker), or ``None`` when it has no
        replay socket, does not answer within :data:`_REPLAY_TIMEOUT_S` or no longer
        holds them all. Called by :meth:`events` on a gap."""
        if self.replay_endpoint is None:
            return None
        socket = self._socket.context.socket(zmq.DEALER)
        socket.connect(self.replay_endpoint)
        found: dict[int, bytes] = {}
        try:
            await socket.send_multipart([b"", first.to_bytes(8, "big")])
            async with asyncio.timeout(_REPLAY_TIMEOUT_S):
                while True:
                    frames = await socket.recv_multipart()
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if seq < 0:  # the end marker
                        break
                    if first <= seq < end:
                        found[seq] = frames[-1]
        except TimeoutError:
            return None
        finally:
            socket.close(linger=0)
        if len(found) != end - first:
            return None
        return [found[seq] for seq in range(first, end)]

    def close(self) -> None:
        """Close the subscription and its ZMQ context."""
        self._socket.close(linger=0)
        self._socket.context.term()
