"""One scrape target for a region with several gateways.

HAProxy hands ``GET /metrics`` to whichever gateway replica it picks, so each gateway's
own exposition would show Prometheus a different process on every scrape. Instead every
gateway publishes its exposition to the region's hints Redis every
:data:`PUBLISH_INTERVAL_S` (a key per gateway that expires after
:data:`LIVE_FOR_S`, and the gateway's id in a sorted set scored by the time), and
``/metrics`` on any gateway answers with its own fresh exposition plus the last one of
every other live gateway, **each sample labelled** ``gateway="<id>"``.

Request counters and histograms then sum over ``gateway``; the per-replica series, which
every gateway exports from the same routing stats, are read with ``max by (replica)``
(the chart's dashboards and alerts do). A gateway that dies drops out within
:data:`LIVE_FOR_S`. While Redis is unreachable a scrape gets this gateway's exposition
alone (still labelled), and its ``firstlight_gateway_metrics_shared`` is 0.

The built-in dashboard's rolling windows travel the same way, but only while somebody
watches: a dashboard poll on any gateway (:meth:`ExpositionShare.windows`) marks the
region's dashboard as watched for :data:`WATCHED_FOR_S`, and while it is, every gateway
publishes its :class:`~firstlight.telemetry.windows.GatewayWindow` with its exposition
(the raw samples, so the merged percentiles stay exact). The first poll after a quiet
spell may therefore show this gateway alone; the reply names the gateways it merged.

The model replicas publish vLLM's own ``vllm:*`` metrics the same way
(:mod:`firstlight.telemetry.engine_metrics`, keys from :func:`replica_metrics_keys`);
:meth:`ExpositionShare.collect` adds every live replica's last exposition to the scrape,
once, labelled ``replica`` (not ``gateway``: no gateway measured them).

Built once per gateway by :class:`~firstlight.serve.gateway_deployment.Gateway`, which
runs :meth:`ExpositionShare.run` as a task; the ``/metrics`` route calls
:meth:`ExpositionShare.collect`, the dashboard's :meth:`ExpositionShare.windows`.
:func:`merge_expositions` is pure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from firstlight.hints._redis import REDIS_ERRORS, OutageLog, with_deadline
from firstlight.telemetry.windows import (
    GatewayWindow,
    MalformedWindowError,
    decode_window,
    encode_window,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from firstlight.telemetry.metrics import GatewayTelemetry

__all__ = [
    "GATEWAY_LABEL",
    "LIVE_FOR_S",
    "PUBLISH_INTERVAL_S",
    "WATCHED_FOR_S",
    "ExpositionShare",
    "fixed_registry",
    "merge_expositions",
    "replica_metrics_keys",
]

_log = logging.getLogger(__name__)

GATEWAY_LABEL = "gateway"
"""The label naming the gateway replica a sample came from."""
PUBLISH_INTERVAL_S = 2.0
"""How often a gateway publishes its exposition."""
LIVE_FOR_S = 3 * PUBLISH_INTERVAL_S
"""A gateway not heard from for this long is gone: its series leave the scrape."""
WATCHED_FOR_S = 10.0
"""A dashboard poll makes every gateway publish its windows for this long (the page
polls every 2 s)."""
_REDIS_DEADLINE_S = 0.5


def replica_metrics_keys(key_prefix: str) -> tuple[str, str]:
    """The Redis keys of a region's replica expositions: (sorted set of live replica ids,
    prefix of the per-replica exposition keys). ``key_prefix`` is the region's hint key
    prefix."""
    return f"{key_prefix}replica-metrics", f"{key_prefix}replica-metrics:"


def merge_expositions(texts: Mapping[str, str], replicas: Iterable[str] = ()) -> bytes:
    """One Prometheus exposition of ``texts`` (gateway id → that gateway's exposition),
    every sample labelled with its gateway, plus the ``replicas``' expositions as they
    are (already labelled ``replica``). A family present in several texts appears once,
    with the first text's help (gateway ids in sorted order, then the replicas)."""
    families: dict[str, Metric] = {}

    def add(text: str, extra: Mapping[str, str]) -> None:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            merged.samples.extend(
                Sample(s.name, {**s.labels, **extra}, s.value, s.timestamp) for s in family.samples
            )

    for gateway in sorted(texts):
        add(texts[gateway], {GATEWAY_LABEL: gateway})
    for text in replicas:
        add(text, {})
    return generate_latest(fixed_registry(list(families.values())))


def fixed_registry(families: list[Metric]) -> CollectorRegistry:
    """A registry that yields exactly ``families`` (to render them with
    ``generate_latest``; also used by :mod:`firstlight.telemetry.engine_metrics`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


class _Families:
    """A collector that yields fixed metric families (the merged exposition)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class ExpositionShare:
    """This gateway's side of the shared scrape (see the module docstring).

    ``telemetry`` is this gateway's (its ``render`` is the own exposition, and its
    ``metrics_shared`` gauge reports :attr:`up`); ``client`` is the hints Redis
    (``None``: no sharing, a scrape is this gateway's own); ``key_prefix`` the region's
    hint key prefix.
    """

    def __init__(
        self,
        gateway_id: str,
        telemetry: GatewayTelemetry,
        client: Redis | None,
        key_prefix: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gateway_id = gateway_id
        self._telemetry = telemetry
        self._client = client
        self._members = f"{key_prefix}gateways"
        self._key_prefix = f"{key_prefix}gateway-metrics:"
        self._window_prefix = f"{key_prefix}gateway-window:"
        self._watched = f"{key_prefix}dashboard-watched"
        self._replica_members, self._replica_prefix = replica_metrics_keys(key_prefix)
        self._clock = clock
        self._outage = OutageLog(
            _log,
            f"gateway {gateway_id}: metrics",
            "a scrape shows this gateway alone until it works",
        )
        self._set_up(client is not None)

    async def publish(self) -> None:
        """Publish this gateway's exposition once, and its dashboard windows when a
        dashboard is watching. Raises what Redis raises."""
        if self._client is None:
            return
        now = self._clock()
        text = self._own()
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._key_prefix + self.gateway_id, text, px=int(LIVE_FOR_S * 1000))
        pipe.zadd(self._members, {self.gateway_id: now})
        pipe.zremrangebyscore(self._members, "-inf", now - LIVE_FOR_S)
        pipe.expire(self._members, int(LIVE_FOR_S * 10))
        pipe.exists(self._watched)
        *_, watched = await with_deadline(pipe.execute(), _REDIS_DEADLINE_S)
        if watched:
            await self._publish_window()

    async def _publish_window(self) -> None:
        """Publish this gateway's dashboard windows; a Redis failure costs the dashboard
        this gateway's windows until the next interval, not the metrics' ``up``."""
        assert self._client is not None
        blob = encode_window(self._telemetry.window(self.gateway_id))
        try:
            await with_deadline(
                self._client.set(
                    self._window_prefix + self.gateway_id, blob, px=int(LIVE_FOR_S * 1000)
                ),
                _REDIS_DEADLINE_S,
            )
        except REDIS_ERRORS as exc:
            _log.debug("gateway %s: dashboard windows not published: %s", self.gateway_id, exc)

    async def run(self) -> None:
        """Publish every :data:`PUBLISH_INTERVAL_S` until cancelled; a Redis failure is
        logged once per outage and retried at the next interval."""
        while True:
            try:
                await self.publish()
                self._outage.ok()
                self._set_up(self._client is not None)
            except REDIS_ERRORS as exc:
                self._outage.failed(exc)
                self._set_up(False)
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    async def collect(self) -> bytes:
        """The region's exposition: this gateway's, fresh, every other live one's last
        published, and every live replica's ``vllm:*`` series (called by
        ``GET /metrics``). Never raises for Redis."""
        texts = {self.gateway_id: self._own()}
        replicas: list[str] = []
        if self._client is not None:
            try:
                texts.update(await self._others())
                replicas = await self._replicas()
            except REDIS_ERRORS as exc:
                _log.debug("gateway %s: scrape without the others: %s", self.gateway_id, exc)
                self._set_up(False)
                texts[self.gateway_id] = self._own()
        return merge_expositions(texts, replicas)

    async def _replicas(self) -> list[str]:
        """The last exposition of every replica heard from within :data:`LIVE_FOR_S`,
        in replica id order."""
        assert self._client is not None
        ids = await with_deadline(
            self._client.zrangebyscore(self._replica_members, self._clock() - LIVE_FOR_S, "+inf"),
            _REDIS_DEADLINE_S,
        )
        replicas = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
        if not replicas:
            return []
        values = await with_deadline(
            self._client.mget([self._replica_prefix + r for r in replicas]), _REDIS_DEADLINE_S
        )
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values if v is not None]

    async def windows(self) -> list[GatewayWindow]:
        """Every live gateway's dashboard windows: this gateway's, fresh, and the last
        published of the others (called by ``GET /dashboard/api/state``, which it marks
        as watched, so the others publish theirs). Never raises for Redis: without it,
        this gateway's alone."""
        own = self._telemetry.window(self.gateway_id)
        if self._client is None:
            return [own]
        try:
            await with_deadline(
                self._client.set(self._watched, b"1", px=int(WATCHED_FOR_S * 1000)),
                _REDIS_DEADLINE_S,
            )
            blobs = await self._others_values(self._window_prefix)
        except REDIS_ERRORS as exc:
            _log.debug("gateway %s: dashboard without the others: %s", self.gateway_id, exc)
            return [own]
        windows = [own]
        for gateway, blob in blobs.items():
            try:
                windows.append(decode_window(blob))
            except MalformedWindowError as exc:
                _log.warning("gateway %s: unreadable dashboard window: %s", gateway, exc)
        return windows

    async def _others(self) -> dict[str, str]:
        values = await self._others_values(self._key_prefix)
        return {gateway: value.decode() for gateway, value in values.items()}

    async def _others_values(self, key_prefix: str) -> dict[str, bytes]:
        """The value at ``key_prefix + id`` of every other live gateway that has one."""
        assert self._client is not None
        now = self._clock()
        ids = await with_deadline(
            self._client.zrangebyscore(self._members, now - LIVE_FOR_S, "+inf"),
            _REDIS_DEADLINE_S,
        )
        others = [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
        others = [i for i in others if i != self.gateway_id]
        if not others:
            return {}
        values = await with_deadline(
            self._client.mget([key_prefix + i for i in others]), _REDIS_DEADLINE_S
        )
        return {
            gateway: value if isinstance(value, bytes) else str(value).encode()
            for gateway, value in zip(others, values, strict=True)
            if value is not None
        }

    def _set_up(self, up: bool) -> None:
        self.up = up
        """Whether the last Redis call worked."""
        self._telemetry.metrics_shared = up

    def _own(self) -> str:
        return self._telemetry.render()[0].decode()
