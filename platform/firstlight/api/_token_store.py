"""The shared counter behind the token quota: one Redis counter per key identity and
minute, which gateways lease tokens from in chunks and give unused chunks back to.

Used only by :class:`~firstlight.api.token_quota.TokenQuota`, which bounds every call
with its own deadline and treats any exception as "Redis unreachable". Both operations
are Lua scripts, so gateways (of one region, or of every region with ``scope:
global``) never race each other: a lease is granted only when the tokens it needs are
still left in the minute, and never more than what is left.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TokenStore"]

_WINDOW_TTL_S = 120
"""A minute's counter outlives the minute (a late give-back still finds it), then goes."""

# KEYS: the minute's counter. ARGV: tokens needed, tokens asked (>= needed), the quota.
# Returns the tokens granted: 0 when fewer than needed are left, else min(asked, left).
_LEASE = """
local taken = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = tonumber(ARGV[3]) - taken
if left < tonumber(ARGV[1]) then return 0 end
local grant = math.min(tonumber(ARGV[2]), left)
redis.call('INCRBY', KEYS[1], grant)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return grant
"""

# KEYS: the minute's counter. ARGV: tokens given back. A counter that expired meanwhile
# is not brought back (nor made negative).
_GIVE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local taken = redis.call('DECRBY', KEYS[1], ARGV[1])
if taken < 0 then redis.call('SET', KEYS[1], 0, 'KEEPTTL') end
return 1
"""


class TokenStore:
    """Token leases of one Redis (``redis.asyncio.Redis``) under ``key_prefix``: the
    region's hints Redis with the region's prefix, or the Redis every region shares."""

    def __init__(self, redis: Any, key_prefix: str) -> None:
        self._lease = redis.register_script(_LEASE)
        self._give_back = redis.register_script(_GIVE_BACK)
        self._prefix = key_prefix

    def key(self, identity: str, window: int) -> str:
        """The counter of ``identity`` in minute ``window`` (tests read it)."""
        return f"{self._prefix}limits:{identity}:tokens:{window}"

    async def lease(self, identity: str, window: int, need: int, ask: int, quota: int) -> int:
        """Take up to ``ask`` tokens of ``identity``'s minute ``window``: all of ``ask``
        when left, what is left when that is at least ``need``, else nothing (0)."""
        granted = await self._lease(
            keys=[self.key(identity, window)], args=[need, ask, quota, _WINDOW_TTL_S]
        )
        return int(granted)

    async def give_back(self, identity: str, window: int, tokens: int) -> None:
        """Return ``tokens`` leased in minute ``window`` that this gateway will not use."""
        await self._give_back(keys=[self.key(identity, window)], args=[tokens])
