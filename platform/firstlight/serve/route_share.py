"""``RouteShare``: the routers of a region's gateways tell each other their routes over
Redis pub/sub (see :mod:`firstlight.region.shared_routes` for why).

Started by :class:`~firstlight.serve.request_router.FirstlightRequestRouter` as a
background task beside the hint subscriber when the region runs several gateways
(``gateway.replicas`` > 1, ``gateway.share_routes``) and has hints Redis. The router's
:class:`~firstlight.region.RouterState` calls :meth:`RouteShare.sink` for each of its
route events (never awaits: the event goes to a buffer); :meth:`RouteShare.run` publishes
the buffer as one message whenever it holds events, and applies the other routers'
messages to the state as they arrive. No routing decision waits on Redis.

While Redis is unreachable the buffer is dropped (bounded, counted). Every connection
is a new *session* of the router, announced at once in an empty batch: on its own
reconnect a router forgets what it heard from peers, and on a peer's new session what
it heard from that peer (a ``done`` may have been lost either way); it then counts
those routes no more until new announcements arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from firstlight.hints import Backoff
from firstlight.hints._redis import REDIS_ERRORS, close_quietly, with_deadline
from firstlight.region import (
    MalformedRoutesError,
    RouteBatch,
    RouterState,
    RouteShareStatus,
    decode_routes,
    encode_routes,
)
from firstlight.region.shared_routes import RouteEvent

__all__ = ["RouteShare", "route_channel"]

_log = logging.getLogger(__name__)

_DEADLINE_S = 2.0
_MAX_BUFFERED = 10_000


def route_channel(key_prefix: str, model: str) -> str:
    """The pub/sub channel of one model's routes in one region (``key_prefix`` is the
    region's hint key prefix)."""
    return f"{key_prefix}routes:{model}"


class RouteShare:
    """One router's side of the region's route share (see the module docstring)."""

    def __init__(
        self,
        connect: Callable[[], Redis],
        channel: str,
        state: RouterState,
        *,
        router_id: str | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.router_id = router_id or uuid.uuid4().hex[:16]
        self._connect = connect
        self._channel = channel
        self._state = state
        self._backoff = backoff or Backoff()
        self._rng = random.Random()
        self._buffer: list[RouteEvent] = []
        self._connections = 0
        self._peer_sessions: dict[str, int] = {}
        self._wake = asyncio.Event()
        self.connected = False
        self.published = 0
        """Events sent."""
        self.applied = 0
        """Events of other routers applied to the state."""
        self.dropped = 0
        """Events lost: buffered while Redis was unreachable, or past the buffer's bound."""
        self.malformed = 0
        """Messages on the channel that were not shared routes (ignored)."""
        state.route_sink = self.sink
        state.route_share = self.status

    @property
    def state(self) -> RouterState:
        """The router state whose routes this share announces and to which it applies
        the other routers' announcements."""
        return self._state

    def status(self) -> RouteShareStatus:
        """For the gateway's metrics (through the router state)."""
        return RouteShareStatus(self.connected, self.published, self.applied, self.dropped)

    def sink(self, event: RouteEvent) -> None:
        """The state's route sink: buffer ``event`` for the next publish. Never blocks."""
        if len(self._buffer) >= _MAX_BUFFERED:
            self.dropped += 1
            return
        self._buffer.append(event)
        self._wake.set()

    async def run(self) -> None:
        """Subscribe and publish until cancelled; reconnect after Redis errors (logged,
        never raised). ``CancelledError`` propagates."""
        attempt = 0
        while True:
            client = self._connect()
            try:
                await self._session(client)
            except REDIS_ERRORS as exc:
                if self.connected or attempt == 0:
                    _log.warning("route share on %s: Redis unreachable (%s)", self._channel, exc)
            finally:
                if self.connected:  # a session that worked: back off afresh
                    attempt = 0
                self.connected = False
                await close_quietly(client)
            self.dropped += len(self._buffer)
            self._buffer.clear()
            await asyncio.sleep(self._backoff.delay_s(attempt, self._rng))
            attempt += 1

    async def _session(self, client: Redis) -> None:
        # No silent reconnects inside redis-py: a dropped connection must end the
        # session, so that the next one is announced and stale routes are forgotten.
        client.set_retry(Retry(NoBackoff(), 0))
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await with_deadline(pubsub.subscribe(self._channel), _DEADLINE_S)
            forgotten = self._state.forget_peer_routes()
            if forgotten:
                _log.info("route share: forgot %d peer routes after a reconnect", forgotten)
            self._connections += 1
            hello = encode_routes(RouteBatch(self.router_id, self._connections))
            await with_deadline(client.publish(self._channel, hello), _DEADLINE_S)
            self.connected = True
            listen = asyncio.create_task(self._listen(pubsub))
            publish = asyncio.create_task(self._publish(client))
            try:
                done, _ = await asyncio.wait((listen, publish), return_when="FIRST_COMPLETED")
                for task in done:
                    task.result()  # re-raises the Redis error that ended the session
                raise ConnectionError("the subscription ended")
            finally:
                for task in (listen, publish):
                    task.cancel()
                await asyncio.gather(listen, publish, return_exceptions=True)
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2

    async def _listen(self, pubsub: PubSub) -> None:
        async for message in pubsub.listen():
            if message.get("type") != "message":
                continue
            try:
                batch = decode_routes(message["data"])
            except MalformedRoutesError as exc:
                self.malformed += 1
                _log.debug("route share: ignored a malformed message (%s)", exc)
                continue
            if batch.router == self.router_id:
                continue
            known = self._peer_sessions.get(batch.router)
            if known != batch.session:
                self._peer_sessions[batch.router] = batch.session
                if known is not None:
                    self._state.forget_peer_routes(batch.router)
            for event in batch.events:
                self._state.apply_peer_route(event, batch.router)
            self.applied += len(batch.events)

    async def _publish(self, client: Redis) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            events, self._buffer = self._buffer, []
            if events:
                message = encode_routes(
                    RouteBatch(self.router_id, self._connections, tuple(events))
                )
                await with_deadline(client.publish(self._channel, message), _DEADLINE_S)
                self.published += len(events)
