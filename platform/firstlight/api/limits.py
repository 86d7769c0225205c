"""Per-API-key limits shared by all gateway replicas of a region, through Redis.

Called by :class:`~firstlight.api.gateway.GatewayCore` for every request: :meth:`acquire`
before the request is read, :meth:`release` when its response ends. Two limits per key
identity (a digest prefix, never the key):

* **concurrency** (``gateway.max_concurrent_per_key``): leases in a Redis sorted set
  scored by their expiry. A lease lives ``_LEASE_TTL_S`` (30 s) and the gateway holding
  it pushes its expiry forward every ``_RENEW_EVERY_S`` (one pipeline for all its leases)
  until the response ends, so a gateway that dies mid-request (OOM, lost node) holds its
  slots for at most 30 s, however long its responses were;
* **request rate** (``gateway.max_requests_per_minute_per_key``): a counter per key and
  minute.

One Lua script checks and takes both atomically, so gateways never race each other.
Redis is never allowed to stall a request: every call has a deadline of
``_REDIS_DEADLINE_S``; when Redis fails, the limiter enforces the same limits **in this
gateway alone** (a region with N gateways then admits up to N times the limit) and
retries Redis after ``_RETRY_AFTER_FAILURE_S`` — safe, because nothing is refused for
Redis's sake, and logged once per outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from firstlight.errors import RateLimitedError

__all__ = ["KeyLimits", "Lease"]

_log = logging.getLogger(__name__)

_REDIS_DEADLINE_S = 0.05
_RETRY_AFTER_FAILURE_S = 5.0
_LEASE_TTL_S = 30.0
"""A lease not renewed for this long is free again: a crashed gateway's slots free after
at most this, a lease whose release missed its deadline too."""
_RENEW_EVERY_S = 10.0
"""How often a gateway renews the leases it holds (a third of the TTL: two renewals may
be late, or fail, before a live lease expires)."""
_ORPHAN_DELAY_S = 1.0
"""How long after a failed take its lease is removed anyway: the script may have run in
Redis with its reply late (a busy event loop misses the deadline, not Redis), and the
removal must come after it."""

# KEYS: leases zset, rate counter. ARGV: now, lease id, lease expiry, max concurrent,
# per-minute limit (0: none), key TTL s. Returns 1 (taken), -1 (concurrency), -2 (rate).
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return -1 end
if tonumber(ARGV[5]) > 0 then
  local n = redis.call('INCR', KEYS[2])
  if n == 1 then redis.call('EXPIRE', KEYS[2], 120) end
  if n > tonumber(ARGV[5]) then return -2 end
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
return 1
"""


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted request's slot; ``shared`` when Redis holds it."""

    identity: str
    lease_id: str
    shared: bool


class KeyLimits:
    """The per-key limits of one gateway (see the module docstring). ``redis`` is a
    ``redis.asyncio.Redis`` client or ``None`` for limits local to this gateway."""

    def __init__(
        self,
        max_concurrent: int,
        per_minute: int | None,
        redis: Any | None = None,
        key_prefix: str = "firstlight:",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.per_minute = per_minute
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._script: Any = redis.register_script(_ACQUIRE) if redis is not None else None
        self._local_inflight: dict[str, int] = {}
        self._local_rate: dict[tuple[str, int], int] = {}
        self._redis_down_until = 0.0
        self._releases: set[asyncio.Task[None]] = set()
        self._held: dict[str, set[str]] = {}
        """Shared lease ids this gateway holds, by identity (renewed until released)."""
        self._renewer: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        """Whether the limits are currently shared through Redis (metrics, tests)."""
        return self._redis is not None and self._clock() >= self._redis_down_until

    async def acquire(self, identity: str) -> Lease:
        """Take a slot for ``identity``; raises :class:`RateLimitedError` (429) when a
        limit is reached."""
        if self.shared:
            lease = await self._acquire_shared(identity)
            if lease is not None:
                return lease
        return self._acquire_local(identity)

    def release(self, lease: Lease) -> None:
        """Give the slot back (called when the response ends, from sync code)."""
        if not lease.shared:
            left = self._local_inflight.get(lease.identity, 1) - 1
            if left > 0:
                self._local_inflight[lease.identity] = left
            else:
                self._local_inflight.pop(lease.identity, None)
            return
        held = self._held.get(lease.identity)
        if held is not None:
            held.discard(lease.lease_id)
            if not held:
                del self._held[lease.identity]
        self._release_later(lease, 0.0)

    def _release_later(self, lease: Lease, delay_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self._release_shared(lease, delay_s))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def renew(self) -> None:
        """Push the expiry of every shared lease this gateway holds to now + TTL, in one
        pipeline (``ZADD XX``: a lease released meanwhile is not brought back). Called
        every ``_RENEW_EVERY_S`` by the renewal task while leases are held; tests call it
        directly."""
        if not self._held or self._redis is None:
            return
        now = self._clock()
        expiry = now + _LEASE_TTL_S
        try:
            async with asyncio.timeout(_REDIS_DEADLINE_S * 10):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for identity, lease_ids in self._held.items():
                        key = self._keys(identity, now)[0]
                        pipe.zadd(key, dict.fromkeys(lease_ids, expiry), xx=True)
                        pipe.expire(key, int(_LEASE_TTL_S))
                    await pipe.execute()
        except Exception as exc:  # the next renewal tries again; a TTL spans two misses
            self._redis_failed(exc)

    async def _renew_while_held(self) -> None:
        while self._held:
            await asyncio.sleep(_RENEW_EVERY_S)
            await self.renew()

    def _hold(self, lease: Lease) -> None:
        self._held.setdefault(lease.identity, set()).add(lease.lease_id)
        if self._renewer is None or self._renewer.done():
            loop = asyncio.get_running_loop()
            self._renewer = loop.create_task(self._renew_while_held())

    async def aclose(self) -> None:
        """Stop renewing and wait for pending releases (the gateway's shutdown)."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    # --- shared (Redis) ------------------------------------------------------------------

    def _keys(self, identity: str, now: float) -> list[str]:
        base = f"{self._prefix}limits:{identity}"
        return [f"{base}:leases", f"{base}:rate:{int(now // 60)}"]

    async def _acquire_shared(self, identity: str) -> Lease | None:
        now = self._clock()
        lease_id = uuid.uuid4().hex
        args = [now, lease_id, now + _LEASE_TTL_S, self.max_concurrent, self.per_minute or 0]
        try:
            async with asyncio.timeout(_REDIS_DEADLINE_S):
                taken = await self._script(
                    keys=self._keys(identity, now), args=[*args, int(_LEASE_TTL_S)]
                )
        except Exception as exc:  # Redis down or slow: this gateway decides alone
            self._redis_failed(exc)
            # The script may have taken the lease all the same, its reply too late: that
            # lease would hold a slot until it expires (a soak lost requests to 429s once
            # a busy hour had leaked every slot this way, with hour-long leases), so it
            # is removed regardless.
            self._release_later(Lease(identity, lease_id, shared=True), _ORPHAN_DELAY_S)
            return None
        if int(taken) == -1:
            raise self._refusal("concurrent requests", self.max_concurrent)
        if int(taken) == -2:
            raise self._refusal("requests per minute", self.per_minute or 0, 60 - now % 60)
        lease = Lease(identity, lease_id, shared=True)
        self._hold(lease)
        return lease

    async def _release_shared(self, lease: Lease, delay_s: float = 0.0) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        leases_key = self._keys(lease.identity, self._clock())[0]
        try:
            async with asyncio.timeout(_REDIS_DEADLINE_S * 10):
                await self._redis.zrem(leases_key, lease.lease_id)  # type: ignore[union-attr]
        except Exception as exc:  # the lease expires on its own
            self._redis_failed(exc)

    def _redis_failed(self, exc: BaseException) -> None:
        if self.shared:
            _log.warning(
                "per-key limits: Redis unreachable (%s); enforcing them in this gateway "
                "alone for %.0f s",
                type(exc).__name__,
                _RETRY_AFTER_FAILURE_S,
            )
        self._redis_down_until = self._clock() + _RETRY_AFTER_FAILURE_S

    # --- local -----------------------------------------------------------------------

    def _acquire_local(self, identity: str) -> Lease:
        now = self._clock()
        if self._local_inflight.get(identity, 0) >= self.max_concurrent:
            raise self._refusal("concurrent requests", self.max_concurrent)
        if self.per_minute is not None:
            window = int(now // 60)
            for stale in [k for k in self._local_rate if k[1] < window]:
                del self._local_rate[stale]
            count = self._local_rate.get((identity, window), 0)
            if count >= self.per_minute:
                raise self._refusal("requests per minute", self.per_minute, 60 - now % 60)
            self._local_rate[(identity, window)] = count + 1
        self._local_inflight[identity] = self._local_inflight.get(identity, 0) + 1
        return Lease(identity, "", shared=False)

    @staticmethod
    def _refusal(what: str, limit: int, retry_after_s: float = 1.0) -> RateLimitedError:
        return RateLimitedError(
            f"too many {what} for this API key (limit {limit})",
            code="rate_limit_exceeded",
            retry_after_s=max(retry_after_s, 1.0),
        )
