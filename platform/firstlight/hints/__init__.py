"""Prefix-cache hints: which replica holds which KV-cache block, shared through Redis.

Engine replicas publish batches of block events (:class:`HintPublisher`); every router
keeps an in-memory :class:`HintMirror` per model in sync (:class:`HintSubscriber`) and
asks it, on the hot path and without I/O, how many leading blocks of a prompt each
replica holds (:meth:`HintMirror.longest_prefix`). Entries expire after a TTL; a
replica's restart bumps its epoch, which drops its stale blocks everywhere. The Redis
layout is described in :mod:`firstlight.hints._codec`.
"""

from firstlight.hints._backoff import Backoff
from firstlight.hints._codec import HintKeys
from firstlight.hints._events import MAX_BLOCK_HASH, BlockEvent, ReplicaSnapshot
from firstlight.hints._redis import redis_client
from firstlight.hints.mirror import HintMirror, MirrorStats
from firstlight.hints.store import DEFAULT_FEED_MAXLEN, HintPublisher
from firstlight.hints.subscriber import HintSubscriber, RedisFactory, SubscriberStatus

__all__ = [
    "DEFAULT_FEED_MAXLEN",
    "MAX_BLOCK_HASH",
    "Backoff",
    "BlockEvent",
    "HintKeys",
    "HintMirror",
    "HintPublisher",
    "HintSubscriber",
    "MirrorStats",
    "RedisFactory",
    "ReplicaSnapshot",
    "SubscriberStatus",
    "redis_client",
]
