"""Per-replica series, read from the routers' state when ``/metrics`` is scraped.

Replica ids change with every restart and every scale-up. OpenTelemetry's SDK keeps each
attribute set it has ever seen for a cumulative exporter (and past 2,000 folds new ones
into an overflow series without labels), so per-replica metrics do not go through it:
this ``prometheus_client`` collector, registered by
:class:`~firstlight.telemetry.GatewayTelemetry` on its registry, reads the replicas'
last routing stats at scrape time and keeps nothing — a replica that is gone simply stops
appearing. Names, units and labels are the catalog's (``replica`` in its attributes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from firstlight.telemetry.catalog import CATALOG, MetricSpec

if TYPE_CHECKING:
    from firstlight.region import ReplicaStats, RouterState

__all__ = ["PER_REPLICA", "ReplicaCollector"]

PER_REPLICA: tuple[MetricSpec, ...] = tuple(s for s in CATALOG if "replica" in s.attributes)
"""The catalog's per-replica metrics, exported by :class:`ReplicaCollector`."""

# Catalog name → the replica stat it exports (queue depth is two, by state).
_STAT: dict[str, Callable[[ReplicaStats], float]] = {
    "firstlight.replica.kv_cache.usage": lambda s: s.kv_cache_usage,
    "firstlight.replica.prefix_cache.queried_tokens": lambda s: s.prefix_cache_queries,
    "firstlight.replica.prefix_cache.hit_tokens": lambda s: s.prefix_cache_hits,
    "firstlight.replica.spec_decode.draft_tokens": lambda s: s.spec_draft_tokens,
    "firstlight.replica.spec_decode.accepted_tokens": lambda s: s.spec_accepted_tokens,
    "firstlight.replica.port.streams": lambda s: s.port_streams,
}
_QUEUE = "firstlight.replica.queue_depth"


class ReplicaCollector(Collector):
    """Exports :data:`PER_REPLICA` for the replicas the routers know now."""

    def __init__(self, region: str, states: Callable[[], Mapping[str, RouterState | None]]):
        self._region = region
        self._states = states

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: the routers may not exist yet

    def collect(self) -> Iterator[Metric]:
        live = [(m, s) for m, s in self._states().items() if s is not None]
        for spec in PER_REPLICA:
            labels = [a.replace(".", "_") for a in spec.attributes]
            family = _family(spec, labels)
            for model, state in live:
                for replica, stats in sorted(state.stats.items()):
                    base = [self._region, model, replica]
                    if spec.name == _QUEUE:
                        family.add_metric([*base, "running"], stats.running)
                        family.add_metric([*base, "waiting"], stats.waiting)
                        continue
                    family.add_metric(base, float(_STAT[spec.name](stats)))
            yield family


def _family(spec: MetricSpec, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    name = spec.prometheus_name
    if spec.kind == "gauge":
        return GaugeMetricFamily(name, spec.description, labels=labels)
    return CounterMetricFamily(name.removesuffix("_total"), spec.description, labels=labels)
