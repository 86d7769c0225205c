"""The Redis side of the hints: replicas publish their block events here.

A :class:`HintPublisher` runs next to each engine replica (in its KV-event bridge) and
writes every batch in one round trip: a Lua script updates the replica's sorted set and
epoch key and appends the event to the model's change feed, atomically, so a subscriber
that bootstraps from the sets and then follows the feed never misses or half-sees a
batch. The key layout is documented in :mod:`firstlight.hints._codec`.

The reading side, :class:`~firstlight.hints.subscriber.HintSubscriber`, is re-exported
here. Redis is never on the routing hot path: routers only read a
:class:`~firstlight.hints.HintMirror`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from firstlight.errors import HintPublishError, HintsError, InvalidBlockEventError, StaleEpochError
from firstlight.hints._codec import HintKeys, pack_hashes
from firstlight.hints._events import BlockEvent
from firstlight.hints._redis import REDIS_ERRORS, redis_client, with_deadline
from firstlight.hints.subscriber import HintSubscriber, SubscriberStatus

__all__ = [
    "DEFAULT_FEED_MAXLEN",
    "HintPublisher",
    "HintSubscriber",
    "SubscriberStatus",
    "redis_client",
]

DEFAULT_FEED_MAXLEN = 100_000
"""Approximate number of events the change feed keeps; a subscriber disconnected for
longer than the feed covers re-bootstraps from the sets instead of resuming."""

# KEYS: 1 replica set, 2 epoch key, 3 feed, 4 replica host-tier set.
# ARGV: 1 epoch, 2 now, 3 cutoff, 4 ttl ms, 5 feed maxlen, 6 cleared, 7 replica id,
#       8 packed stored, 9 packed removed, 10 number of stored, 11 packed offloaded,
#       12 packed offload_removed, 13 number of removed, 14 number of offloaded, then
#       the stored, removed, offloaded and offload_removed hashes as decimals.
# Applied in the event's order: removed and offloaded leave the device set, offloaded
# join the host set, offload_removed leave it, stored leave it and join the device set.
# Returns {1, feed entry id}, or {0, newer epoch} when the replica has moved on.
_PUBLISH_LUA = """
local known = tonumber(redis.call('GET', KEYS[2]) or '') or -1
local epoch = tonumber(ARGV[1])
if known > epoch then
  return {0, known}
end
if known < epoch or ARGV[6] == '1' then
  redis.call('DEL', KEYS[1], KEYS[4])
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
local function zrem(key, from, to)
  for i = from, to, 1000 do
    redis.call('ZREM', key, unpack(ARGV, i, math.min(i + 999, to)))
  end
end
local function zadd(key, from, to)
  for i = from, to, 500 do
    local zargs = {}
    for j = i, math.min(i + 499, to) do
      zargs[#zargs + 1] = ARGV[2]
      zargs[#zargs + 1] = ARGV[j]
    end
    redis.call('ZADD', key, unpack(zargs))
  end
end
local first_stored = 15
local first_removed = first_stored + tonumber(ARGV[10])
local first_offloaded = first_removed + tonumber(ARGV[13])
local first_dropped = first_offloaded + tonumber(ARGV[14])
zrem(KEYS[1], first_removed, first_dropped - 1)
zadd(KEYS[4], first_offloaded, first_dropped - 1)
if redis.call('EXISTS', KEYS[4]) == 1 then
  zrem(KEYS[4], first_dropped, #ARGV)
  zrem(KEYS[4], first_stored, first_removed - 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
zadd(KEYS[1], first_stored, first_removed - 1)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local fields = {'v', '1', 'replica', ARGV[7], 'epoch', ARGV[1], 'at', ARGV[2],
  'cleared', ARGV[6], 'stored', ARGV[8], 'removed', ARGV[9]}
if ARGV[11] ~= '' then
  fields[#fields + 1] = 'offloaded'
  fields[#fields + 1] = ARGV[11]
end
if ARGV[12] ~= '' then
  fields[#fields + 1] = 'offload_removed'
  fields[#fields + 1] = ARGV[12]
end
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', unpack(fields))
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1, id}
"""


class HintPublisher:
    """Publishes one replica's block events for one model.

    ``redis`` is owned by the caller (who closes it); ``clock`` returns wall-clock
    seconds (scores are compared across hosts, so it must be ``time.time``-like);
    ``ttl_s`` is how long a block lives in Redis without being stored again.
    ``timeout_s`` bounds every publish. Raises :class:`HintsError` naming the argument
    when one is out of range.
    """

    def __init__(
        self,
        redis: Redis,
        key_prefix: str,
        model: str,
        replica_id: str,
        epoch: int,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        *,
        feed_maxlen: int = DEFAULT_FEED_MAXLEN,
        timeout_s: float = 2.0,
    ) -> None:
        # Validates replica_id and epoch with the same rules as every event.
        BlockEvent(replica_id, epoch, (), ())
        if not ttl_s > 0:
            raise HintsError(f"ttl_s = {ttl_s!r}: must be > 0")
        if feed_maxlen < 1:
            raise HintsError(f"feed_maxlen = {feed_maxlen!r}: must be >= 1")
        if not timeout_s > 0:
            raise HintsError(f"timeout_s = {timeout_s!r}: must be > 0")
        self._redis = redis
        self._keys = HintKeys(key_prefix, model)
        self._replica_id = replica_id
        self._epoch = epoch
        self._ttl_s = float(ttl_s)
        self._clock = clock
        self._feed_maxlen = feed_maxlen
        self._timeout_s = timeout_s
        self._script = redis.register_script(_PUBLISH_LUA)

    @property
    def replica_id(self) -> str:
        """The replica whose events this publisher writes."""
        return self._replica_id

    @property
    def epoch(self) -> int:
        """The replica's epoch; events of any other epoch are refused."""
        return self._epoch

    async def start_epoch(self) -> None:
        """Announce this publisher's epoch: delete the replica's old blocks in Redis and
        append a ``cleared`` event, so every mirror drops the stale blocks.

        Called once by the engine's KV-event bridge after the engine (re)starts, before
        the first :meth:`publish`. Raises :class:`StaleEpochError` when Redis already
        holds a newer epoch, :class:`HintPublishError` when Redis fails or times out.
        """
        await self.publish(BlockEvent(self._replica_id, self._epoch, (), (), cleared=True))

    async def publish(self, event: BlockEvent) -> None:
        """Write one batch in one round trip: ``cleared`` drops the replica's sets,
        ``removed`` members are deleted, ``offloaded`` ones move to the host-tier set,
        ``offload_removed`` ones leave it, ``stored`` members move back to (or are
        (re)scored with now in) the device set;
        members older than ``ttl_s`` are trimmed, the set's, epoch key's and feed's
        expiry is refreshed (a model nobody publishes for leaves nothing behind), and the
        event is appended to the feed. An empty batch is a no-op.

        Called by the engine's KV-event bridge for each batch, and periodically with the
        replica's resident blocks to keep hot prefixes alive (and to repair Redis after
        it lost its data). Raises :class:`InvalidBlockEventError` when the event is of
        another replica or epoch, :class:`StaleEpochError` when Redis holds a newer epoch
        for the replica (nothing is written), and :class:`HintPublishError` when Redis
        fails or times out (the batch may or may not have been written).
        """
        if event.replica_id != self._replica_id or event.epoch != self._epoch:
            raise InvalidBlockEventError(
                f"event of replica {event.replica_id!r} epoch {event.epoch} handed to the "
                f"publisher of replica {self._replica_id!r} epoch {self._epoch}"
            )
        if not (
            event.stored
            or event.removed
            or event.cleared
            or event.offloaded
            or event.offload_removed
        ):
            return
        now = self._clock()
        args: list[str | bytes | int] = [
            event.epoch,
            repr(float(now)),
            repr(float(now - self._ttl_s)),
            math.ceil(self._ttl_s * 1000),
            self._feed_maxlen,
            "1" if event.cleared else "0",
            self._replica_id,
            pack_hashes(event.stored),
            pack_hashes(event.removed),
            len(event.stored),
            pack_hashes(event.offloaded),
            pack_hashes(event.offload_removed),
            len(event.removed),
            len(event.offloaded),
        ]
        for hashes in (event.stored, event.removed, event.offloaded, event.offload_removed):
            args.extend(str(block_hash) for block_hash in hashes)
        keys = [
            self._keys.replica_set(self._replica_id),
            self._keys.replica_epoch(self._replica_id),
            self._keys.feed,
            self._keys.replica_host_set(self._replica_id),
        ]
        try:
            reply: Any = await with_deadline(
                self._script(keys=keys, args=args, client=self._redis), self._timeout_s
            )
        except REDIS_ERRORS as exc:
            raise HintPublishError(
                f"could not publish {len(event.stored)} stored / {len(event.removed)} "
                f"removed blocks of replica {self._replica_id!r} to {self._keys.feed!r}: "
                f"{exc!r}"
            ) from exc
        if int(reply[0]) == 0:
            raise StaleEpochError(self._replica_id, self._epoch, int(reply[1]))
