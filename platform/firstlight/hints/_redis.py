"""The one boundary where the hints code calls redis-py: clients, deadlines, errors.

Used by the publisher and the subscriber. Every Redis call goes through
:func:`with_deadline`, so none can hang the event loop's task forever even when the
client itself has no socket timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from firstlight.config import HintsConfig

__all__ = [
    "REDIS_ERRORS",
    "OutageLog",
    "close_quietly",
    "redis_client",
    "tls_options",
    "with_deadline",
]

REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
"""What a Redis call raises when Redis is unreachable, slow or answers with an error
(``TimeoutError`` is also what :func:`with_deadline` raises)."""

_T = TypeVar("_T")


class OutageLog:
    """One warning when a recurring Redis task starts failing and one line when it works
    again, however many tries fail in between: the background loops that share state
    through Redis (hint, metrics and window publishers) retry every interval, and an
    outage must not flood the log. ``what`` names the task (``replica r1: hints``);
    ``consequence`` says what the outage costs while it lasts."""

    __slots__ = ("_consequence", "_logger", "_what", "up")

    def __init__(self, logger: logging.Logger, what: str, consequence: str) -> None:
        self._logger, self._what, self._consequence = logger, what, consequence
        self.up = True
        """Whether the last try worked (metrics and tests read it)."""

    def ok(self) -> None:
        """The task worked: logs the end of an outage, once."""
        if not self.up:
            self._logger.info("%s: Redis works again", self._what)
        self.up = True

    def failed(self, exc: BaseException) -> None:
        """The task failed with ``exc``: logs the start of an outage, once."""
        if self.up:
            self._logger.warning(
                "%s: Redis fails (%s: %s); %s",
                self._what,
                type(exc).__name__,
                exc,
                self._consequence,
            )
        self.up = False


def redis_client(config: HintsConfig, *, connect_timeout_s: float = 5.0) -> Redis:
    """A ``redis.asyncio.Redis`` client for the hints of ``config``: binary replies (the
    feed carries packed hashes), a connect timeout, and a single immediate retry on a
    dropped connection, so an outage surfaces quickly and the subscriber's own backoff
    takes over.

    It sets no socket (read/write) timeout on purpose: the publisher and subscriber bound
    every call with :func:`with_deadline` instead, and redis-py implements a socket
    timeout on writes with ``asyncio.wait_for``, which on Python 3.11 can swallow a
    task's cancellation (CPython gh-86296) and leave a cancelled subscriber running.

    Called by the app builders, e.g. ``HintSubscriber(lambda: redis_client(cfg), ...)``.
    Opens no connection yet. Raises :class:`~firstlight.errors.ConfigError` when the
    password reference cannot be resolved. The caller closes it with ``aclose()``.
    """
    password = config.password.resolve() if config.password is not None else None
    client: Redis = Redis.from_url(
        config.redis_url,
        password=password,
        decode_responses=False,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 1),
        **tls_options(config),
    )
    return client


def tls_options(config: HintsConfig) -> dict[str, Any]:
    """The redis-py keyword arguments of ``config``'s TLS: the CA file that verifies the
    server (``hints.tls_ca_file``), if any. Hostname and certificate are always checked
    for ``rediss://`` (redis-py's defaults). Used by every client the platform makes."""
    if config.tls_ca_file is None:
        return {}
    return {"ssl_ca_certs": str(config.tls_ca_file)}


async def with_deadline(call: Awaitable[_T], timeout_s: float) -> _T:
    """Await a Redis call, raising ``TimeoutError`` after ``timeout_s`` seconds (redis-py
    drops the connection of a cancelled command, so the client stays usable).

    If the task was cancelled while the call completed and the cancellation got lost on
    the way (Python 3.11's ``asyncio.wait_for``, used inside redis-py, can drop it),
    ``CancelledError`` is raised here, so a cancelled task always ends.
    """
    task = asyncio.current_task()
    cancelling = task.cancelling() if task is not None else 0
    async with asyncio.timeout(timeout_s):
        result = await call
    if task is not None and task.cancelling() > cancelling:
        raise asyncio.CancelledError
    return result


async def close_quietly(client: Redis) -> None:
    """Close ``client``, ignoring errors of an already broken connection."""
    with contextlib.suppress(*REDIS_ERRORS):
        await client.aclose()
