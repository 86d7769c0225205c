"""Keeps a router's :class:`~firstlight.hints.HintMirror` in sync with Redis.

:meth:`HintSubscriber.run` is one long-running task per (router, model). It bootstraps
(reads the feed's newest id, then every replica set — device and host tier — and epoch,
then follows the feed from that id: a batch written in between is both in the snapshot
and replayed, which is harmless, so none is lost), then applies each feed entry to the
mirror.

When Redis is lost the mirror is left as it is, so routing keeps using it;
:attr:`HintSubscriber.status` says since when it is stale. The subscriber reconnects with
bounded, jittered exponential backoff and resumes from the last entry it applied if the
feed still holds it, or bootstraps again (then the mirror equals what Redis holds).
Malformed entries and members are skipped and counted, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from firstlight.errors import HintsError
from firstlight.hints._backoff import Backoff
from firstlight.hints._codec import (
    HintKeys,
    MalformedEntryError,
    decode_feed_entry,
    parse_epoch,
    parse_member,
)
from firstlight.hints._events import ReplicaSnapshot
from firstlight.hints._redis import REDIS_ERRORS, close_quietly, with_deadline
from firstlight.hints.mirror import HintMirror

__all__ = ["HintSubscriber", "RedisFactory", "SubscriberStatus"]

logger = logging.getLogger(__name__)

RedisFactory = Callable[[], Redis]
"""Makes a new client (binary replies) for each connection attempt, e.g.
``lambda: redis_client(config.hints)``. The subscriber owns each client it gets: it turns
off redis-py's automatic retries on it and closes it."""

_EMPTY_FEED_ID = "0-0"


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    """What a subscriber is doing, for health checks, metrics and logs."""

    connected: bool
    """Following the feed now (bootstrapped or resumed, no error since)."""
    stale_since: float | None
    """Clock time the feed was lost (or the first attempt failed); ``None`` when
    connected or before the first attempt. The mirror still answers meanwhile."""
    reconnects: int
    """Times the feed was re-established after being lost."""
    bootstraps: int
    """Full loads from the replica sets (the first one, and each failed resume)."""
    last_id: str | None
    """Feed id the mirror is in sync with; ``None`` before the first bootstrap."""
    events_applied: int
    """Feed entries applied to the mirror (stale-epoch ones included)."""
    malformed_skipped: int
    """Feed entries and set members that could not be decoded and were skipped."""
    last_error: str | None
    """The last Redis error, for logs and health endpoints."""


class HintSubscriber:
    """Follows one model's change feed into ``mirror``.

    ``redis_factory`` makes a client per connection attempt; ``clock`` returns wall-clock
    seconds (published times and set scores are wall-clock); ``sleep`` and ``rng`` are
    injectable for tests. ``timeout_s`` bounds every Redis call; ``block_ms`` is how
    long one ``XREAD`` waits for new entries (the client's socket timeout must exceed
    it). Every ``prune_interval_s`` the mirror prunes up to ``prune_budget`` blocks.
    Raises :class:`HintsError` naming the argument when one is out of range.
    """

    def __init__(
        self,
        redis_factory: RedisFactory,
        key_prefix: str,
        model: str,
        mirror: HintMirror,
        clock: Callable[[], float] = time.time,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        timeout_s: float = 2.0,
        block_ms: int = 1000,
        read_count: int = 1000,
        scan_count: int = 500,
        prune_interval_s: float = 1.0,
        prune_budget: int = 5_000,
    ) -> None:
        for name, value in (("timeout_s", timeout_s), ("prune_interval_s", prune_interval_s)):
            if not value > 0:
                raise HintsError(f"{name} = {value!r}: must be > 0")
        for name, count in (
            ("block_ms", block_ms),
            ("read_count", read_count),
            ("scan_count", scan_count),
            ("prune_budget", prune_budget),
        ):
            if count < 1:
                raise HintsError(f"{name} = {count!r}: must be >= 1")
        self._redis_factory = redis_factory
        self._keys = HintKeys(key_prefix, model)
        self._mirror = mirror
        self._clock = clock
        self._backoff = backoff if backoff is not None else Backoff()
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._timeout_s = timeout_s
        self._block_ms = block_ms
        self._read_count = read_count
        self._scan_count = scan_count
        self._prune_interval_s = prune_interval_s
        self._prune_budget = prune_budget

        self._connected = False
        self._ever_connected = False
        self._stale_since: float | None = None
        self._reconnects = 0
        self._bootstraps = 0
        self._last_id: str | None = None
        self._events_applied = 0
        self._malformed_skipped = 0
        self._last_error: str | None = None
        self._failed_attempts = 0
        self._last_prune = clock()

    @property
    def mirror(self) -> HintMirror:
        """The mirror this subscriber keeps in sync."""
        return self._mirror

    @property
    def status(self) -> SubscriberStatus:
        """A snapshot of the subscriber's state."""
        return SubscriberStatus(
            connected=self._connected,
            stale_since=self._stale_since,
            reconnects=self._reconnects,
            bootstraps=self._bootstraps,
            last_id=self._last_id,
            events_applied=self._events_applied,
            malformed_skipped=self._malformed_skipped,
            last_error=self._last_error,
        )

    async def run(self) -> None:
        """Bootstrap, then follow the feed until cancelled; reconnect after Redis errors.

        Started as a task by the router's app builder and cancelled at shutdown;
        ``CancelledError`` propagates. Raises :class:`HintsError` only for a misconfigured
        client (text replies, or a socket timeout shorter than ``block_ms``); Redis
        errors are recorded in :attr:`status` and retried, never raised.
        """
        while True:
            client = self._redis_factory()
            try:
                self._check_client(client)
                # Without redis-py's silent reconnect, every dropped connection reaches
                # _sync, which notices a restarted Redis (the feed lost our last id).
                client.set_retry(Retry(NoBackoff(), 0))
                await self._sync(client)
                await self._follow(client)
            except REDIS_ERRORS as exc:
                self._lose_feed(exc)
            finally:
                await close_quietly(client)
            delay_s = self._backoff.delay_s(self._failed_attempts, self._rng)
            self._failed_attempts += 1
            await self._sleep(delay_s)

    # --- connection --------------------------------------------------------------------

    def _check_client(self, client: Redis) -> None:
        options = client.connection_pool.connection_kwargs
        if options.get("decode_responses"):
            raise HintsError(
                "decode_responses = True: the hint feed carries packed binary hashes; "
                "give the subscriber a client with decode_responses=False"
            )
        socket_timeout = options.get("socket_timeout")
        if socket_timeout is not None and socket_timeout * 1000 <= self._block_ms:
            raise HintsError(
                f"block_ms = {self._block_ms!r}: must be below the client's socket "
                f"timeout ({socket_timeout!r} s), or every blocking read would time out"
            )

    async def _sync(self, client: Redis) -> None:
        """Resume from the last applied entry if the feed still holds it, else bootstrap."""
        resumed = False
        if self._last_id is not None and self._last_id != _EMPTY_FEED_ID:
            held = await self._call(
                client.xrange(self._keys.feed, min=self._last_id, max=self._last_id, count=1)
            )
            resumed = bool(held)
        if not resumed:
            await self._bootstrap(client)
        if self._ever_connected:
            self._reconnects += 1
            logger.info(
                "hints feed %s: reconnected (%s) after %.1f s stale",
                self._keys.feed,
                "resumed" if resumed else "re-bootstrapped",
                self._clock() - (self._stale_since or self._clock()),
            )
        self._connected = True
        self._ever_connected = True
        self._stale_since = None

    def _lose_feed(self, exc: BaseException) -> None:
        self._connected = False
        self._last_error = f"{type(exc).__name__}: {exc}"
        if self._stale_since is None:
            self._stale_since = self._clock()
            logger.warning(
                "hints feed %s lost, routing on the local mirror until Redis is back: %s",
                self._keys.feed,
                self._last_error,
            )
        else:
            logger.debug("hints feed %s: reconnection failed: %s", self._keys.feed, exc)

    async def _call(self, call: Awaitable[Any], extra_s: float = 0.0) -> Any:
        return await with_deadline(call, self._timeout_s + extra_s)

    # --- bootstrap ---------------------------------------------------------------------

    async def _bootstrap(self, client: Redis) -> None:
        """Load every replica set into the mirror; the feed is read first so that no
        batch written while the sets are read is missed."""
        newest = await self._call(client.xrevrange(self._keys.feed, "+", "-", count=1))
        last_id = _text_id(newest[0][0]) if newest else _EMPTY_FEED_ID
        now = self._clock()
        cutoff = now - self._mirror.ttl_s
        snapshot: dict[str, ReplicaSnapshot] = {}
        seen: set[str] = set()
        cursor: Any = 0
        while True:
            cursor, keys = await self._call(
                client.scan(cursor, match=self._keys.replica_set_pattern, count=self._scan_count)
            )
            # A replica has a device-tier set, a host-tier set or both: read it once.
            replicas = list(
                dict.fromkeys(
                    r
                    for r in (self._replica_of(k) for k in keys)
                    if r is not None and r not in seen
                )
            )
            seen.update(replicas)
            if replicas:
                pipe = client.pipeline(transaction=False)
                for replica in replicas:
                    pipe.zrangebyscore(
                        self._keys.replica_set(replica), cutoff, "+inf", withscores=True
                    )
                    pipe.zrangebyscore(
                        self._keys.replica_host_set(replica), cutoff, "+inf", withscores=True
                    )
                    pipe.get(self._keys.replica_epoch(replica))
                replies = await self._call(pipe.execute(raise_on_error=False))
                for i, replica in enumerate(replicas):
                    loaded = self._replica_snapshot(
                        replica, replies[3 * i], replies[3 * i + 1], replies[3 * i + 2], now
                    )
                    if loaded is not None:
                        snapshot[replica] = loaded
            if int(cursor) == 0:
                break
        self._mirror.load_snapshot(snapshot)
        self._last_id = last_id
        self._bootstraps += 1
        logger.info(
            "hints feed %s: bootstrapped %d replicas, %d entries, from id %s",
            self._keys.feed,
            len(snapshot),
            len(self._mirror),
            last_id,
        )

    def _replica_of(self, key: Any) -> str | None:
        try:
            return self._keys.replica_of_set_key(key)
        except MalformedEntryError as exc:
            self._skip_malformed(f"replica set key: {exc}")
            return None

    def _replica_snapshot(
        self, replica: str, members: Any, host_members: Any, raw_epoch: Any, now: float
    ) -> ReplicaSnapshot | None:
        replies = (members, host_members, raw_epoch)
        if any(isinstance(reply, Exception) for reply in replies):
            self._skip_malformed(
                f"replica {replica!r}: {members!r} / {host_members!r} / {raw_epoch!r}"
            )
            return None
        if raw_epoch is None:
            return None  # the set and its epoch key expired between SCAN and reading
        try:
            epoch = parse_epoch(raw_epoch)
        except MalformedEntryError as exc:
            self._skip_malformed(f"epoch of replica {replica!r}: {exc}")
            return None
        return ReplicaSnapshot(
            epoch, self._aged(replica, members, now), self._aged(replica, host_members, now)
        )

    def _aged(self, replica: str, members: Any, now: float) -> list[tuple[int, float]]:
        """``(block hash, age)`` of a replica set's ``(member, score)`` pairs; malformed
        members are skipped and counted."""
        blocks: list[tuple[int, float]] = []
        for pair in members:
            try:
                member, score = pair
                blocks.append((parse_member(member), now - float(score)))
            except (TypeError, ValueError) as exc:  # ValueError includes MalformedEntryError
                self._skip_malformed(f"set member of replica {replica!r}: {exc}")
        return blocks

    # --- following ---------------------------------------------------------------------

    async def _follow(self, client: Redis) -> None:
        while True:
            assert self._last_id is not None
            response = await self._call(
                client.xread(
                    {self._keys.feed: self._last_id},
                    count=self._read_count,
                    block=self._block_ms,
                ),
                extra_s=self._block_ms / 1000,
            )
            self._failed_attempts = 0
            for entry_id, fields in _entries(response):
                self._apply_entry(entry_id, fields)
            now = self._clock()
            if now - self._last_prune >= self._prune_interval_s:
                self._last_prune = now
                self._mirror.prune(self._prune_budget)

    def _apply_entry(self, entry_id: Any, fields: Any) -> None:
        self._last_id = _text_id(entry_id)
        try:
            if not isinstance(fields, Mapping):
                raise MalformedEntryError(f"fields {fields!r} are not a mapping")
            event, published_at = decode_feed_entry(fields)
        except MalformedEntryError as exc:
            self._skip_malformed(f"feed entry {self._last_id}: {exc}")
            return
        self._mirror.apply(event, age_s=max(self._clock() - published_at, 0.0))
        self._events_applied += 1

    def _skip_malformed(self, what: str) -> None:
        self._malformed_skipped += 1
        self._mirror.record_malformed()
        logger.warning("hints feed %s: skipped malformed %s", self._keys.feed, what)


def _text_id(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _entries(response: Any) -> list[tuple[Any, Any]]:
    """The ``(id, fields)`` pairs of an ``XREAD`` reply: RESP2 gives a list of
    ``[stream, entries]``, RESP3 a ``{stream: [entries]}`` mapping."""
    if not response:
        return []
    if isinstance(response, Mapping):
        return [(e[0], e[1]) for batches in response.values() for batch in batches for e in batch]
    return [(e[0], e[1]) for stream in response for e in stream[1]]
