"""vLLM's own metrics (``vllm:*``) from every model replica: two ways out.

**Ray's metrics agent (every mode).** A replica's engine is built with vLLM's
``RayPrometheusStatLogger`` (:class:`~firstlight.engine.vllm_engine.VllmEngine`,
``ray_metrics``), which re-creates every ``vllm:*`` series as a ``ray.util.metrics``
metric labelled ``ReplicaId`` (the Ray replica id). Ray's per-node metrics agent serves
them at the node's metrics export port (``ray-metrics`` in the chart) as
``ray_vllm_<name>`` (:data:`RAY_VLLM_PREFIX`; vLLM replaces the ``:``, Ray adds ``ray_``)
with Ray's labels beside vLLM's. The chart's engine ``PodMonitor`` scrapes that port on
every Ray pod and relabels the series back to what the relay below shows: ``vllm:<name>``,
``replica`` from ``ReplicaId``, ``region`` added, Ray's labels dropped — so the dashboards
and alerts read one set of names. Nothing here touches Redis: the series outlive a Redis
outage.

**The Redis relay (local mode only, :func:`relays_engine_metrics`).** Nothing scrapes
Ray's agent in ``make up``, and the region's ``/metrics`` is the one target a local
Prometheus or the dashboards know. There vLLM's ``PrometheusStatLogger`` also keeps the
series in the replica process's ``prometheus_client`` registry; every
:data:`PUBLISH_INTERVAL_S` each replica renders the ``vllm:`` families of that registry,
**labels every sample with** ``region`` **and** ``replica="<Ray replica id>"``, and
publishes the text to the region's hints Redis under a key that expires after
:data:`LIVE_FOR_S` (its id in a sorted set scored by the time) — the same mechanism the
gateways use for their own expositions (:mod:`firstlight.telemetry.gateways`). Whichever
gateway answers ``GET /metrics`` adds the last exposition of every live replica
(``ExpositionShare.collect`` reads them), once and without a ``gateway`` label. A replica
that dies leaves the scrape within :data:`LIVE_FOR_S`; Redis being down costs the relayed
series, never a request (Ray's agent still has them). In ``kubernetes`` mode the relay is
off: the same series through both paths would be counted twice by every ``sum``.

Started by :class:`~firstlight.serve.model_server.ModelServer` as a background task
(:func:`publish_engine_metrics`) for every non-simulated engine in local mode; the
``sim`` engine has no vLLM metrics and exports nothing either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from firstlight.errors import FirstlightError
from firstlight.hints._redis import REDIS_ERRORS, OutageLog, redis_client, with_deadline
from firstlight.telemetry.gateways import (
    LIVE_FOR_S,
    PUBLISH_INTERVAL_S,
    fixed_registry,
    replica_metrics_keys,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from firstlight.config import HintsConfig, PlatformConfig

__all__ = [
    "RAY_REPLICA_LABEL",
    "RAY_VLLM_PREFIX",
    "REPLICA_LABEL",
    "VLLM_LABELS",
    "VLLM_PREFIX",
    "VLLM_SERIES",
    "ReplicaMetricsPublisher",
    "publish_engine_metrics",
    "relays_engine_metrics",
    "render_vllm_metrics",
]

_log = logging.getLogger(__name__)

VLLM_PREFIX = "vllm:"
"""Only families whose name starts with this leave the replica (not Ray's or Python's)."""
REPLICA_LABEL = "replica"
"""The label naming the Ray replica a ``vllm:*`` sample came from."""
RAY_VLLM_PREFIX = "ray_vllm_"
"""How ``vllm:<name>`` is called at Ray's metrics agent (the chart's engine PodMonitor
renames it back)."""
RAY_REPLICA_LABEL = "ReplicaId"
"""The label vLLM's Ray stat logger names the Serve replica with (the chart's engine
PodMonitor copies it to :data:`REPLICA_LABEL`)."""
VLLM_LABELS = ("model_name", "engine", "region", REPLICA_LABEL)
"""The labels of every ``vllm:*`` series in the scrape: vLLM's own (``model_name`` is
the served model name, ``engine`` the data-parallel rank) and the two added here."""
VLLM_SERIES: tuple[str, ...] = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
)
"""The ``vllm:*`` series the shipped dashboards and alerts read (vLLM exports more; the
offline dashboard tests accept exactly these, and the vLLM scrape test checks that a real
engine exports each)."""
_REDIS_DEADLINE_S = 0.5


def relays_engine_metrics(config: PlatformConfig) -> bool:
    """Whether replicas relay their ``vllm:*`` series through Redis to the region's
    ``/metrics``: in ``local`` mode only, where nothing scrapes Ray's metrics agent.
    Called by :class:`~firstlight.serve.model_server.ModelServer` (whether to start
    :func:`publish_engine_metrics`) and :func:`~firstlight.serve.model_server.build_engine`
    (whether vLLM keeps a process registry to relay)."""
    return config.mode == "local"


def render_vllm_metrics(region: str, replica: str, registry: CollectorRegistry = REGISTRY) -> str:
    """The ``vllm:*`` families of ``registry``, every sample labelled with ``region`` and
    ``replica``, in Prometheus' text format; ``""`` when there are none (no vLLM engine
    in this process). Called by :class:`ReplicaMetricsPublisher` every interval."""
    families: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(VLLM_PREFIX):
            continue
        labelled = Metric(family.name, family.documentation, family.type, family.unit)
        labelled.samples = [
            Sample(
                s.name,
                {**s.labels, "region": region, REPLICA_LABEL: replica},
                s.value,
                s.timestamp,
                s.exemplar,
            )
            for s in family.samples
        ]
        families.append(labelled)
    if not families:
        return ""
    return generate_latest(fixed_registry(families)).decode()


class ReplicaMetricsPublisher:
    """One replica's side: publishes :func:`render_vllm_metrics` to the region's Redis.

    ``client`` is the region's hints Redis, ``key_prefix`` its hint key prefix (the same
    the gateways' :class:`~firstlight.telemetry.gateways.ExpositionShare` reads);
    ``registry`` the process registry vLLM's logger writes to (a test passes its own).
    """

    def __init__(
        self,
        client: Redis,
        key_prefix: str,
        region: str,
        replica_id: str,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._members, self._key_prefix = replica_metrics_keys(key_prefix)
        self._region = region
        self.replica_id = replica_id
        self._registry = registry
        self._clock = clock
        self._outage = OutageLog(
            _log,
            f"replica {replica_id}: vLLM metrics",
            "they leave the region's scrape until it works",
        )

    async def publish(self) -> bool:
        """Publish the exposition once; ``False`` when there was nothing to publish.
        Raises what Redis raises."""
        text = render_vllm_metrics(self._region, self.replica_id, self._registry)
        if not text:
            return False
        now = self._clock()
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._key_prefix + self.replica_id, text, px=int(LIVE_FOR_S * 1000))
        pipe.zadd(self._members, {self.replica_id: now})
        pipe.zremrangebyscore(self._members, "-inf", now - LIVE_FOR_S)
        pipe.expire(self._members, int(LIVE_FOR_S * 10))
        await with_deadline(pipe.execute(), _REDIS_DEADLINE_S)
        return True

    async def run(self) -> None:
        """Publish every :data:`PUBLISH_INTERVAL_S` until cancelled; a Redis failure is
        logged once per outage and retried at the next interval."""
        while True:
            try:
                await self.publish()
                self._outage.ok()
            except REDIS_ERRORS as exc:
                self._outage.failed(exc)
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    @property
    def up(self) -> bool:
        """Whether the last publish worked."""
        return self._outage.up


async def publish_engine_metrics(
    config: HintsConfig, key_prefix: str, region: str, replica_id: str
) -> None:
    """Run a :class:`ReplicaMetricsPublisher` on a client of the region's hints Redis
    until cancelled (the replica's background task; closes its client at the end). An
    unresolvable Redis password reference is logged, and nothing is published."""
    try:
        client = redis_client(config)
    except FirstlightError as exc:
        _log.warning("replica %s: vLLM metrics stay unpublished: %s", replica_id, exc)
        return
    try:
        await ReplicaMetricsPublisher(client, key_prefix, region, replica_id).run()
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
