"""The vLLM adapter's KV event feed over a real ZMQ PUB/SUB pair, with vLLM's own event
classes and encoding (``vllm.distributed.kv_events``): events by medium become the
router's two tiers; a batch lost on the way is replayed from vLLM's own publisher where
it has a replay socket, and otherwise clears the replica's hints before the next batch
is applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from firstlight.engine.kv_feed import KvEventFeed
from firstlight.engine.kv_tiers import BatchSequence
from firstlight.engine.protocol import CacheEvent


def _stored(blocks: Sequence[int], medium: str | None = "GPU") -> BlockStored:
    return BlockStored(
        block_hashes=list(blocks),
        parent_block_hash=None,
        token_ids=[],
        block_size=16,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


class _Publisher:
    """vLLM's wire format (topic, 8-byte big-endian sequence number, msgpack batch) on a
    real XPUB socket, whose subscriber the test's feed reads."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self.socket = context.socket(zmq.XPUB)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self._encoder = msgspec.msgpack.Encoder()

    async def send(self, seq: int, events: list[Any]) -> None:
        payload = self._encoder.encode(KVEventBatch(ts=0.0, events=events))
        await self.socket.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), payload])


@pytest.fixture
async def wire() -> AsyncIterator[tuple[_Publisher, KvEventFeed]]:
    context = zmq.asyncio.Context()
    publisher = _Publisher(context)
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"kv")
    subscriber.connect(f"tcp://127.0.0.1:{publisher.port}")
    await publisher.socket.recv()  # the subscription arrived: nothing is lost to joining late
    yield publisher, KvEventFeed(subscriber, "m")
    subscriber.close(linger=0)
    publisher.socket.close(linger=0)
    context.term()


async def _take(feed: AsyncIterator[CacheEvent], n: int) -> list[CacheEvent]:
    return [await anext(feed) for _ in range(n)]


async def test_events_by_medium_become_the_two_tiers(wire: tuple[_Publisher, KvEventFeed]) -> None:
    publisher, kv = wire
    feed = kv.events()
    await publisher.send(0, [_stored([1, 2, 3]), _stored([1, 2], "CPU")])
    await publisher.send(1, [BlockRemoved(block_hashes=[1, 3], medium="GPU")])
    await publisher.send(2, [AllBlocksCleared()])
    assert await _take(feed, 3) == [
        CacheEvent(stored=(1, 2, 3)),
        CacheEvent(removed=(3,), offloaded=(1,)),
        CacheEvent(cleared=True),
    ]


async def test_a_lost_batch_clears_the_hints_before_the_next_applies(
    wire: tuple[_Publisher, KvEventFeed],
) -> None:
    publisher, kv = wire
    feed = kv.events()
    await publisher.send(0, [_stored([1, 2])])
    # Batch 1 (evicting block 1) never arrives: the mirror must not keep trusting it.
    await publisher.send(2, [_stored([7])])
    await publisher.send(3, [_stored([8])])
    assert await _take(feed, 4) == [
        CacheEvent(stored=(1, 2)),
        CacheEvent(cleared=True),
        CacheEvent(stored=(7,)),
        CacheEvent(stored=(8,)),
    ]


async def test_a_subscriber_that_missed_the_first_batches_starts_clean(
    wire: tuple[_Publisher, KvEventFeed],
) -> None:
    publisher, kv = wire
    feed = kv.events()
    await publisher.send(5, [_stored([4])])
    assert await _take(feed, 2) == [CacheEvent(cleared=True), CacheEvent(stored=(4,))]


def test_the_sequence_counts_each_gap_once() -> None:
    sequence = BatchSequence()
    assert [sequence.follows(s) for s in (0, 1, 4, 5, 5, 6)] == [
        True,
        True,
        False,
        True,
        False,
        True,
    ]
    assert sequence.gaps == 2
    assert sequence.expected == 7


async def test_batches_missed_are_replayed_by_vllms_own_publisher(tmp_path: Path) -> None:
    """vLLM's ``ZmqEventPublisher`` with its replay socket, as the engine runs it: the
    adapter subscribes after some batches went out, finds the gap at the first batch it
    receives and asks the replay socket for the missing ones; every batch is applied in
    order and the hints are never cleared."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    endpoint, replay = f"ipc://{tmp_path}/kv.sock", f"ipc://{tmp_path}/replay.sock"
    publisher = ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic="kv")
    context = zmq.asyncio.Context()
    probe = context.socket(zmq.SUB)
    probe.setsockopt(zmq.SUBSCRIBE, b"kv")
    probe.connect(endpoint)
    subscriber = context.socket(zmq.SUB)
    published = 0

    def publish(block: int) -> None:
        nonlocal published
        publisher.publish(KVEventBatch(ts=0.0, events=[_stored([block])]))
        published += 1

    async def until(socket_or_task: Any) -> bool:
        """Publish one batch, then whether ``socket_or_task`` produced within 0.2 s."""
        publish(published)
        waiting = socket_or_task if isinstance(socket_or_task, asyncio.Task) else None
        try:
            if waiting is not None:
                await asyncio.wait_for(asyncio.shield(waiting), 0.2)
            else:
                await asyncio.wait_for(socket_or_task.recv_multipart(), 0.2)
        except TimeoutError:
            return False
        return True

    try:
        # Batches go out until the probe sees one: the publisher is sending, and every
        # batch so far is in its replay buffer. The engine's subscriber does not exist yet.
        async with asyncio.timeout(30):
            while not await until(probe):
                pass
        missed = published
        subscriber.setsockopt(zmq.SUBSCRIBE, b"kv")
        subscriber.connect(endpoint)
        feed = KvEventFeed(subscriber, "m", replay).events()
        first = asyncio.ensure_future(anext(feed))
        async with asyncio.timeout(30):
            while not await until(first):
                pass
            if first.result() != CacheEvent(stored=(0,)):  # not replayed: fail, do not wait
                events = [first.result()]
            else:
                events = [first.result(), *await _take(feed, published - 1)]
    finally:
        subscriber.close(linger=0)
        probe.close(linger=0)
        context.term()
        publisher.shutdown()
    assert missed >= 1
    assert events == [CacheEvent(stored=(block,)) for block in range(published)]
