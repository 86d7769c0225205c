"""The per-key token quota (``gateway.max_tokens_per_minute_per_key``): tokens reserved at
admission, settled to what the request used when it ends.

Called by :class:`~firstlight.api.gateway.GatewayCore` for every client request:
:meth:`TokenQuota.reserve` once the prompt is tokenized (its prompt tokens plus its
``max_tokens``, capped by ``token_quota.reserve_output_tokens``), :meth:`TokenQuota.settle`
exactly once when its response ends, however it ends (done, error, client gone). A
request a peer region forwarded here is not charged again: its own region reserved it.

**Windows.** The quota counts per key identity and fixed minute (as the request rate
does); a refusal's ``Retry-After`` is the rest of the minute. A reservation is settled
in the minute it was taken: what it did not use is given back to that minute; what it
used beyond it (only with ``reserve_output_tokens``) is charged to the current one.

**Sharing without Redis on the decision path.** With a :class:`TokenStore` (the region's
hints Redis, or with ``scope: global`` a Redis all regions reach) each gateway holds a
*lease* per key and minute: tokens taken from the shared counter in chunks of
``lease_tokens`` (a twentieth of the quota by default). A request whose reservation fits
in the lease is admitted with no I/O; when the lease runs below half a chunk the next
one is fetched in the background; only a request the lease cannot cover waits for Redis,
at most ``deadline_ms``. A gateway gives back what it holds beyond one chunk after a
settlement, so at most one chunk per gateway and key sits idle while another gateway
refuses. A lease whose reply comes after the deadline still credits the gateway when it
arrives, so no token is lost to a slow reply.

**Redis unreachable** (a failed or late lease; tried again ``_RETRY_AFTER_FAILURE_S``
later): tokens already leased are used first, then ``token_quota.when_unreachable``
decides — ``local`` (default) enforces the whole quota in this gateway alone, ``open``
admits without a token quota, ``closed`` refuses with 503. ``local`` is the default for
the reason the request limits fall back the same way: an outage of a shared store (for
``global``, one in another region) must not take a region's serving down, yet a key
still cannot use more than the quota at any one gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from firstlight.api._token_store import TokenStore
from firstlight.config import GatewayConfig
from firstlight.errors import NoCapacityError, RateLimitedError
from firstlight.telemetry import RequestObservation

__all__ = ["Reservation", "TokenQuota", "TokenStore", "tokens_used"]

_log = logging.getLogger(__name__)

_RETRY_AFTER_FAILURE_S = 5.0
_CLIENT_CLOSED = 499
"""The status of a request whose client went away (``firstlight.api.gateway``'s)."""
_LATE_LEASE_S = 2.0
"""How long a lease whose reply missed its deadline may still credit the gateway; past
this its task is cancelled (the client sets no socket timeout of its own)."""

Source = Literal["shared", "local", "open"]


@dataclass(slots=True)
class Reservation:
    """One admitted request's tokens: ``tokens`` reserved in minute ``window``, from the
    shared lease, this gateway's own count, or nothing (``open``, Redis unreachable)."""

    identity: str
    window: int
    tokens: int
    source: Source
    settled: bool = False


@dataclass(slots=True)
class _Pool:
    """What this gateway holds of one key's minute."""

    leased: int = 0
    """Tokens taken from the shared counter."""
    used: int = 0
    """Of those, reserved or used by this gateway's requests (may exceed ``leased``:
    an overrun charged at settlement, leased with the next request)."""
    local: int = 0
    """Tokens admitted on this gateway's own count while Redis was unreachable."""
    prefetching: bool = False

    @property
    def free(self) -> int:
        return self.leased - self.used


class TokenQuota:
    """The token quota of one gateway (see the module docstring). ``per_minute=None``:
    off (:meth:`reserve` returns ``None``). ``store=None``: the quota is this gateway's
    alone."""

    def __init__(
        self,
        per_minute: int | None,
        *,
        reserve_output_tokens: int | None = None,
        lease_tokens: int | None = None,
        deadline_s: float = 0.05,
        when_unreachable: Literal["local", "open", "closed"] = "local",
        store: TokenStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.per_minute = per_minute
        self._reserve_output = reserve_output_tokens
        quota = per_minute or 1
        self.lease_tokens = min(quota, lease_tokens or max(1, quota // 20))
        self._deadline_s = deadline_s
        self._when_unreachable = when_unreachable
        self._store = store
        self._clock = clock
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._window = 0
        self._down_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(
        cls,
        gateway: GatewayConfig,
        store: TokenStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> TokenQuota:
        """The quota ``gateway`` configures, shared through ``store`` if given (built by
        the Ray gateway deployment; the gateway builds a local one without)."""
        settings = gateway.token_quota
        return cls(
            gateway.max_tokens_per_minute_per_key,
            reserve_output_tokens=settings.reserve_output_tokens,
            lease_tokens=settings.lease_tokens,
            deadline_s=settings.deadline_ms / 1000,
            when_unreachable=settings.when_unreachable,
            store=store,
            clock=clock,
        )

    @property
    def shared(self) -> bool:
        """Whether the quota is currently shared through Redis (metrics, tests)."""
        return self._store is not None and self._clock() >= self._down_until

    def held(self, identity: str) -> int:
        """Leased tokens this gateway holds unreserved for ``identity`` this minute."""
        pool = self._pools.get((identity, int(self._clock() // 60)))
        return 0 if pool is None else pool.free

    def used(self, identity: str) -> int:
        """Tokens ``identity``'s requests reserved or used at this gateway this minute,
        settled ones at what they used (metrics, tests)."""
        pool = self._pools.get((identity, int(self._clock() // 60)))
        return 0 if pool is None else pool.used + pool.local

    async def reserve(
        self, identity: str, prompt_tokens: int, max_tokens: int
    ) -> Reservation | None:
        """Reserve a request's tokens; ``None`` when the quota is off. Raises
        :class:`RateLimitedError` (429) when they do not fit in what is left of the
        minute, :class:`NoCapacityError` (503) when Redis is unreachable and
        ``when_unreachable`` is ``closed``."""
        if self.per_minute is None:
            return None
        output = (
            max_tokens if self._reserve_output is None else min(max_tokens, self._reserve_output)
        )
        cost = prompt_tokens + output
        now = self._clock()
        if cost > self.per_minute:
            raise self._refusal(
                f"this request reserves {cost} tokens ({prompt_tokens} of prompt and "
                f"{output} of max_tokens), more than the quota of this API key "
                f"({self.per_minute} tokens per minute); ask for fewer max_tokens",
                now,
            )
        window = int(now // 60)
        pool = self._pool(identity, window)
        if pool.free < cost and self.shared:
            await self._lease(identity, window, pool, need=cost - pool.free)
        if pool.free >= cost:
            pool.used += cost
            if self.shared and pool.free < self.lease_tokens // 2 and not pool.prefetching:
                pool.prefetching = True
                self._spawn(self._fill(identity, window, pool, need=1))
            return Reservation(identity, window, cost, "shared")
        if self.shared:  # Redis answered: the minute's quota is spent
            raise self._refusal(self._over(cost), now)
        return self._unshared(identity, window, pool, cost, now)

    def settle(self, reservation: Reservation | None, used_tokens: int | None) -> None:
        """Settle ``reservation`` to the ``used_tokens`` its request used (prompt and
        output); ``None``: unknown (a peer region served it), so the reservation stands.
        Called from sync code when the response ends; a second call does nothing."""
        if reservation is None or reservation.settled:
            return
        reservation.settled = True
        if reservation.source == "open" or used_tokens is None:
            return
        overrun = used_tokens - reservation.tokens
        if overrun > 0:  # charged to the current minute
            pool = self._pool(reservation.identity, int(self._clock() // 60))
        else:
            found = self._pools.get((reservation.identity, reservation.window))
            if found is None:  # its minute is over: nothing to give back
                return
            pool = found
        if reservation.source == "local":
            pool.local += overrun
            return
        pool.used += overrun
        surplus = pool.free - self.lease_tokens
        if surplus > 0 and self.shared and self._store is not None:
            pool.leased -= surplus
            back = self._store.give_back(reservation.identity, reservation.window, surplus)
            self._spawn(self._guarded(back))

    async def aclose(self) -> None:
        """Wait for leases and give-backs in flight (the gateway's shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- shared ---------------------------------------------------------------------------

    async def _lease(self, identity: str, window: int, pool: _Pool, need: int) -> None:
        """Lease at least ``need`` tokens into ``pool``, waiting at most the deadline; a
        reply that comes later still credits the pool (:meth:`_fill` goes on)."""
        task = self._spawn(self._fill(identity, window, pool, need))
        done, _ = await asyncio.wait({task}, timeout=self._deadline_s)
        if not done:
            self._unreachable(TimeoutError(f"no lease within {self._deadline_s * 1000:.0f} ms"))

    async def _fill(self, identity: str, window: int, pool: _Pool, need: int) -> None:
        assert self._store is not None
        assert self.per_minute is not None
        ask = max(need, self.lease_tokens)
        try:
            async with asyncio.timeout(max(_LATE_LEASE_S, self._deadline_s)):
                pool.leased += await self._store.lease(identity, window, need, ask, self.per_minute)
        except Exception as exc:  # the caller falls back as configured
            self._unreachable(exc)
        finally:
            pool.prefetching = False

    async def _guarded(self, call: Coroutine[Any, Any, None]) -> None:
        try:
            async with asyncio.timeout(max(_LATE_LEASE_S, self._deadline_s)):
                await call
        except Exception as exc:  # the tokens stay counted until the minute ends
            self._unreachable(exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _unreachable(self, exc: BaseException) -> None:
        if self.shared:
            _log.warning(
                "token quota: Redis unreachable (%s: %s); %s for %.0f s",
                type(exc).__name__,
                exc,
                {
                    "local": "this gateway enforces the quota alone",
                    "open": "no token quota",
                    "closed": "refusing what the leased tokens do not cover",
                }[self._when_unreachable],
                _RETRY_AFTER_FAILURE_S,
            )
        self._down_until = self._clock() + _RETRY_AFTER_FAILURE_S

    # --- this gateway alone -------------------------------------------------------------

    def _unshared(
        self, identity: str, window: int, pool: _Pool, cost: int, now: float
    ) -> Reservation:
        mode = "local" if self._store is None else self._when_unreachable
        if mode == "open":
            return Reservation(identity, window, cost, "open")
        if mode == "closed":
            raise NoCapacityError(
                "the token quota's Redis is unreachable and this gateway holds too few "
                "tokens of this API key's quota (gateway.token_quota.when_unreachable: "
                "closed)",
                code="quota_unavailable",
                retry_after_s=_RETRY_AFTER_FAILURE_S,
            )
        assert self.per_minute is not None
        if pool.used + pool.local + cost > self.per_minute:
            raise self._refusal(self._over(cost), now)
        pool.local += cost
        return Reservation(identity, window, cost, "local")

    def _pool(self, identity: str, window: int) -> _Pool:
        if window != self._window:  # a new minute: forget all but the last one
            self._window = window
            for stale in [k for k in self._pools if k[1] < window - 1]:
                del self._pools[stale]
        return self._pools.setdefault((identity, window), _Pool())

    def _over(self, cost: int) -> str:
        return (
            f"too many tokens per minute for this API key (limit {self.per_minute}; "
            f"this request reserves {cost})"
        )

    @staticmethod
    def _refusal(message: str, now: float) -> RateLimitedError:
        return RateLimitedError(
            message, code="rate_limit_exceeded", retry_after_s=max(60 - now % 60, 1.0)
        )


def tokens_used(obs: RequestObservation, region: str) -> int | None:
    """What a request settles to, from its observation when it ended: its prompt and the
    output it got; nothing when it was refused or failed before any output (a client that
    went away, status 499, still pays for what it got); ``None`` when a peer region served
    it (its output is not counted here, so the reservation stands). Called by the gateway."""
    if obs.served_region is not None and obs.served_region != region:
        return None
    output = obs.output_tokens or 0
    if output == 0 and obs.status not in (200, _CLIENT_CLOSED):
        return 0
    return (obs.input_tokens or 0) + output
