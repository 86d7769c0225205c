"""One index-faults measurement, in one process: the replica side (vLLM's KV-event wire
format on a real ZMQ socket, the vLLM adapter reading it, the ModelServer's hint bridge
publishing to Redis), a gateway's router side (the hint mirror and subscriber, the router
state with the configured policy), and the trials of each fault.

Called by ``firstlight bench index-faults`` (:mod:`firstlight_bench.tools.index_faults`,
whose docstring says what is measured and how) through :func:`measure`, and by its tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
import zmq.asyncio

from firstlight.config import HintsConfig, PlatformConfig
from firstlight.hints import HintMirror, HintSubscriber, redis_client
from firstlight.region import ReplicaStats, RouterState, with_shared_rates
from firstlight.routing import RequestView, RoutingInput, build_policy

if TYPE_CHECKING:
    from firstlight.serve.model_server import ModelServer

__all__ = ["measure"]

BLOCK_SIZE = 32


class _Engine:
    """A vLLM engine's KV-event publisher as the adapter sees it: vLLM's wire format
    (topic ``kv``, 8-byte big-endian sequence number, msgpack ``KVEventBatch``) on a real
    XPUB socket, which tells when the adapter's subscription arrived."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self._batch = KVEventBatch
        self.socket = context.socket(zmq.XPUB)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self._encoder = msgspec.msgpack.Encoder()
        self.next_seq = 0

    async def subscribed(self, timeout_s: float) -> None:
        await asyncio.wait_for(self.socket.recv(), timeout_s)

    async def send(self, events: list[Any], *, lose: int = 0) -> float:
        """Publish one batch after losing ``lose`` batches; returns when it was sent."""
        seq = self.next_seq + lose
        payload = self._encoder.encode(self._batch(ts=time.time(), events=events))
        self.next_seq = seq + 1
        sent_at = time.monotonic()
        await self.socket.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), payload])
        return sent_at


class _Replica:
    """One incarnation of a model replica: its engine's event socket, the vLLM adapter
    reading it, and the ModelServer's hint bridge publishing to Redis."""

    def __init__(
        self, context: zmq.asyncio.Context, config: PlatformConfig, region: str, rid: str
    ) -> None:
        from firstlight.engine.kv_feed import KvEventFeed
        from firstlight.engine.vllm_engine import VllmEngine

        self.replica_id = rid
        self.engine = _Engine(context)
        self._events = context.socket(zmq.SUB)
        self._events.setsockopt(zmq.SUBSCRIBE, b"kv")
        self._events.connect(f"tcp://127.0.0.1:{self.engine.port}")
        # The vLLM adapter's event feed without a model: all the bridge reads of it.
        adapter = VllmEngine.__new__(VllmEngine)
        adapter._feed = KvEventFeed(self._events, config.models[0].name)
        # What ModelServer._publish_hints reads; __init__ would ask Ray for the replica id
        # and load the model.
        bridge = _bridge_class()
        self._server = bridge.__new__(bridge)
        self._server._config = config
        self._server._region = region
        self._server._model = config.models[0]
        self._server._replica_id = rid
        self._server._engine = adapter
        self._server._announce = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self, epoch: int, timeout_s: float) -> float:
        """Wait for the adapter's subscription, then start the bridge with ``epoch``;
        returns when the bridge started."""
        await self.engine.subscribed(timeout_s)
        self._server._epoch = epoch
        started_at = time.monotonic()
        self._task = asyncio.create_task(self._server._publish_hints())
        return started_at

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._events.close(linger=0)
        self.engine.socket.close(linger=0)


@functools.cache
def _bridge_class() -> type[ModelServer]:
    from firstlight.serve.model_server import ModelServer

    class _Bridge(ModelServer):
        """The ModelServer, less the graceful shutdown Ray awaits (an ``async
        __del__``): Python calls it on garbage collection and drops the coroutine."""

        def __del__(self) -> None:  # type: ignore[override]
            return None

    return _Bridge


class _Router:
    """A gateway's router side of the model: the mirror and subscriber as
    ``FirstlightRequestRouter._start_hints`` builds them, the router state with the
    configured policy, and the replica set as ``update_replicas`` applies it."""

    def __init__(self, config: PlatformConfig, region: str, key_prefix: str) -> None:
        hints = config.hints
        self.mirror = HintMirror(hints.ttl_s)
        self.subscriber = HintSubscriber(
            lambda: redis_client(hints), key_prefix, config.models[0].name, self.mirror
        )
        policy = build_policy(
            config.router.policy, dict(config.router.params), rng=random.Random(), clock=time.time
        )
        self.state = RouterState(region, config.models[0].name, policy, clock=time.time)
        self.state.cache = self.mirror
        self._region = region

    def set_replicas(self, replica_ids: Sequence[str]) -> None:
        self.state.replica_set(replica_ids)
        views = {r: ReplicaStats(at=time.time()).view(r, self._region, None) for r in replica_ids}
        self.state.set_replicas(with_shared_rates(views))

    def credited(self, request: RequestView, replica_id: str) -> tuple[int, bool]:
        """The blocks the policy credits ``replica_id`` with, and whether it wins."""
        state = self.state
        decision = state.policy.choose(
            RoutingInput(request, tuple(state.replicas.values()), state.cache)
        )
        blocks = next((c.cached_blocks for c in decision.ranked if c.replica_id == replica_id), 0)
        return blocks, decision.winner.replica_id == replica_id


async def _credited_in_full(
    router: _Router, request: RequestView, rid: str, timeout_s: float
) -> bool:
    """Ask until ``rid`` is credited with the whole prefix; returns whether it wins."""
    deadline = time.monotonic() + timeout_s
    while True:
        blocks, wins = router.credited(request, rid)
        if blocks == len(request.block_hashes):
            return wins
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rid}: credited {blocks} blocks, not the stored prefix")
        await asyncio.sleep(0)  # a yield, so the bridge and subscriber run


async def _healed_at(
    router: _Router, request: RequestView, rid: str, timeout_s: float
) -> tuple[float | None, int]:
    """The start of the first decision that credits ``rid`` with nothing (``None``
    after ``timeout_s``), and how many decisions were asked."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        asked_at = time.monotonic()
        polls += 1
        if router.credited(request, rid)[0] == 0:
            return asked_at, polls
        if asked_at > deadline:
            return None, polls
        await asyncio.sleep(0)


def _stored(blocks: Sequence[int]) -> Any:
    from vllm.distributed.kv_events import BlockStored

    return BlockStored(
        block_hashes=list(blocks), parent_block_hash=None, token_ids=[],
        block_size=BLOCK_SIZE, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


def _epoch_after(previous: int) -> int:
    return max(time.time_ns() // 1_000_000, previous + 1)  # as ModelServer stamps it


async def _run_fault(
    fault: str,
    trials: int,
    blocks: int,
    context: zmq.asyncio.Context,
    config: PlatformConfig,
    router: _Router,
    timeout_s: float,
) -> list[dict[str, Any]]:
    from vllm.distributed.kv_events import AllBlocksCleared

    region = router.state.region
    rng = random.Random(f"{fault}:{trials}:{blocks}")
    samples: list[dict[str, Any]] = []
    replica: _Replica | None = None
    epoch = 0
    try:
        for trial in range(trials):
            rid = f"{fault}-{trial}" if fault == "replica-removal" else fault
            if replica is None:
                replica = _Replica(context, config, region, rid)
                epoch = _epoch_after(epoch)
                await replica.start(epoch, timeout_s)
            router.set_replicas([rid, "idle"])
            prefix = tuple(rng.getrandbits(64) for _ in range(blocks))
            request = RequestView(f"{fault}-{trial}", blocks * BLOCK_SIZE + 40, prefix, BLOCK_SIZE)
            await replica.engine.send([_stored(prefix)])
            won = await _credited_in_full(router, request, rid, timeout_s)
            # Not a synchronisation: the fault comes at a random moment, so it meets the
            # bridge's 100 ms flush cycle at any phase, not always right after a flush.
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            if fault == "cache-reset":
                t0 = await replica.engine.send([AllBlocksCleared()])
            elif fault == "sequence-gap":  # the batch evicting the prefix is lost
                t0 = await replica.engine.send([_stored([rng.getrandbits(64)])], lose=1)
            elif fault == "engine-restart":
                await replica.stop()  # the engine dies; nothing is published for it
                replica = _Replica(context, config, region, rid)
                epoch = _epoch_after(epoch)
                t0 = await replica.start(epoch, timeout_s)
            else:
                t0 = time.monotonic()
                router.set_replicas(["idle"])
            t1, polls = await _healed_at(router, request, rid, timeout_s)
            if fault == "replica-removal":
                await replica.stop()
                replica = None
            samples.append(
                {
                    "fault": fault,
                    "trial": trial,
                    "healed": t1 is not None,
                    "heal_ms": None if t1 is None else round((t1 - t0) * 1000.0, 3),
                    "won_before": won,
                    "credited_after": router.credited(request, rid)[0],
                    "mirror_after": router.mirror.longest_prefix(prefix).get(rid, 0),
                    "polls": polls,
                }
            )
    finally:
        if replica is not None:
            await replica.stop()
    return samples


async def measure(
    faults: Sequence[str],
    trials: int,
    *,
    redis_url: str = "redis://127.0.0.1:6379/0",
    blocks: int = 16,
    timeout_s: float = 10.0,
    key_prefix: str | None = None,
) -> dict[str, Any]:
    """Run ``trials`` of each fault (module docstring); returns ``samples`` (one per
    trial) and ``feed`` (the subscriber's reconnects, bootstraps and events applied).

    Every key is written under ``key_prefix`` (default: a new one) and deleted at the end.
    Raises ``TimeoutError`` when the setup does not come up within ``timeout_s`` (Redis
    unreachable, a prefix never credited); a fault that does not heal within
    ``timeout_s`` is a sample with ``healed`` false.
    """
    # Imported before the subscriber starts: importing vLLM blocks the loop for seconds.
    import vllm.distributed.kv_events  # noqa: F401

    from firstlight.serve.model_server import hint_key_prefix

    _bridge_class()
    key_prefix = key_prefix or f"flbench:{uuid.uuid4().hex[:12]}:"
    hints = HintsConfig(redis_url=redis_url, key_prefix=key_prefix)
    config = PlatformConfig(hints=hints)
    region = config.regions[0].name
    router = _Router(config, region, hint_key_prefix(config, region))
    context = zmq.asyncio.Context()
    follow = asyncio.create_task(router.subscriber.run())
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not router.subscriber.status.connected:
            if time.monotonic() > deadline or follow.done():
                raise TimeoutError(f"hint feed not connected: {router.subscriber.status}")
            await asyncio.sleep(0)
        for fault in faults:
            samples += await _run_fault(fault, trials, blocks, context, config, router, timeout_s)
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        context.destroy(linger=0)
        await _delete_keys(hints)
    status = router.subscriber.status
    feed = {
        "reconnects": status.reconnects,
        "bootstraps": status.bootstraps,
        "events_applied": status.events_applied,
    }
    return {"samples": samples, "feed": feed}


async def _delete_keys(hints: HintsConfig) -> None:
    client = redis_client(hints)
    try:
        keys = [k async for k in client.scan_iter(match=f"{hints.key_prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
