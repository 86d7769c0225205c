"""Every metric Firstlight exports: name, kind, unit, attributes and bucket boundaries.

One table, read by :mod:`firstlight.telemetry.metrics` (which creates the instruments),
by the docs (``docs/observability.md`` lists it) and by the tests that hold the Grafana
dashboards and alert rules to the names a real ``/metrics`` scrape shows.

Names follow OpenTelemetry's GenAI semantic conventions where one exists
(``gen_ai.server.*``, seconds, the conventions' bucket boundaries); Firstlight's own
metrics live under ``firstlight.``. Prometheus sees them through the OpenTelemetry
Prometheus exporter, which turns dots into underscores and appends the unit
(``gen_ai.server.time_to_first_token`` → ``gen_ai_server_time_to_first_token_seconds``)
and ``_total`` to counters: :attr:`MetricSpec.prometheus_name`.

Attributes are bounded: ``region``, ``model`` (a configured model name, or ``unknown``),
``replica`` (a Ray replica id), ``peer`` (a configured region), ``route``, ``reason``,
``policy``, ``state``, ``direction``, ``outcome``, ``kind``, ``error.type`` (an HTTP
status) and the GenAI conventions' ``gen_ai.operation.name``, ``gen_ai.request.model``
(the same value as ``model``, so generic GenAI dashboards work while Firstlight's own
join on ``model``), ``gen_ai.provider.name`` (:data:`GEN_AI_PROVIDER`) and
``gen_ai.token.type``. Never a request id, a prompt or an API key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CATALOG", "GEN_AI_PROVIDER", "MetricSpec", "spec"]

Kind = Literal["histogram", "counter", "gauge", "observable_counter"]

# The GenAI conventions' advised boundaries (semantic-conventions, gen-ai-metrics).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0)  # fmt: skip
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                      20.48, 40.96, 81.92)  # fmt: skip
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # fmt: skip
# Firstlight's own: a routing decision takes microseconds; a prediction misses by ms..s.
DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2)
PREDICTION_ERROR_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                              2.5, 5.0, 10.0)  # fmt: skip

_UNIT_SUFFIX = {"s": "_seconds"}
"""Units the exporter appends to names (it drops annotations like ``{token}`` and ``1``)."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric."""

    name: str
    """OpenTelemetry instrument name."""
    kind: Kind
    unit: str
    """UCUM unit (``s``, ``1``) or an annotation (``{token}``), as OpenTelemetry writes it."""
    description: str
    attributes: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    """Explicit histogram bucket boundaries (histograms only)."""

    @property
    def prometheus_name(self) -> str:
        """The series name a Prometheus scrape shows (histograms add ``_bucket``,
        ``_sum`` and ``_count`` to it)."""
        base = self.name.replace(".", "_")
        suffix = _UNIT_SUFFIX.get(self.unit, "")
        if suffix and not base.endswith(suffix):
            base += suffix
        if self.kind in ("counter", "observable_counter"):
            base += "_total"
        return base


GEN_AI_PROVIDER = "firstlight"
"""``gen_ai.provider.name`` of the gateway's GenAI metrics. The conventions define it as
the provider "as identified by the client or server instrumentation" and as the
discriminator of provider-specific telemetry: the API the client called is Firstlight's
(its routing headers, its error shapes, several engines behind it), not vLLM's, whose own
metrics carry the ``vllm:`` prefix."""

_REQ = (
    "region",
    "model",
    "route",
    "gen_ai.operation.name",
    "gen_ai.request.model",
    "gen_ai.provider.name",
)

CATALOG: tuple[MetricSpec, ...] = (
    # --- GenAI semantic conventions, recorded by the gateway per request -------------
    MetricSpec(
        "gen_ai.server.time_to_first_token",
        "histogram",
        "s",
        "Time from the request reaching the gateway to the first output token.",
        _REQ,
        TTFT_BUCKETS_S,
    ),
    MetricSpec(
        "gen_ai.server.time_per_output_token",
        "histogram",
        "s",
        "Time per output token after the first (decode), per request.",
        _REQ,
        TPOT_BUCKETS_S,
    ),
    MetricSpec(
        "gen_ai.server.request.duration",
        "histogram",
        "s",
        "Time from the request reaching the gateway to its last byte; errors carry "
        "error.type (the HTTP status).",
        (*_REQ, "error.type"),
        DURATION_BUCKETS_S,
    ),
    MetricSpec(
        "gen_ai.client.token.usage",
        "histogram",
        "{token}",
        "Input and output tokens per request.",
        (*_REQ, "gen_ai.token.type"),
        TOKEN_BUCKETS,
    ),
    # --- routing ------------------------------------------------------------------------
    MetricSpec(
        "firstlight.route.decisions",
        "counter",
        "{request}",
        "Region decisions: local, spill_over, fail_over, from_peer (served here for a "
        "peer) or rejected (no capacity anywhere).",
        ("region", "model", "reason", "policy"),
    ),
    MetricSpec(
        "firstlight.route.decision.duration",
        "histogram",
        "s",
        "Time the in-region routing policy took to rank the replicas.",
        ("region", "model", "policy"),
        DECISION_BUCKETS_S,
    ),
    MetricSpec(
        "firstlight.route.ttft_prediction_error",
        "histogram",
        "s",
        "Absolute difference between the predicted and the observed time to first "
        "token; direction=under when the first token came later than predicted.",
        ("region", "model", "direction"),
        PREDICTION_ERROR_BUCKETS_S,
    ),
    MetricSpec(
        "firstlight.route.fallbacks",
        "observable_counter",
        "{request}",
        "Requests Ray sent to another replica than the policy's first choice.",
        ("region", "model"),
    ),
    MetricSpec(
        "firstlight.route.share_up",
        "gauge",
        "1",
        "1 while this gateway's router shares its routes with the region's other gateways "
        "through Redis, 0 while it cannot (absent with one gateway or the share off).",
        ("region", "model"),
    ),
    MetricSpec(
        "firstlight.route.shared_events",
        "observable_counter",
        "{event}",
        "Route announcements (routed, first token, done) between the region's gateways: "
        "direction=sent, heard (applied from the others) or dropped (not sent).",
        ("region", "model", "direction"),
    ),
    # --- replicas (from their routing stats, every 0.5 s) -------------------------------
    MetricSpec(
        "firstlight.replicas.healthy",
        "gauge",
        "{replica}",
        "Replicas of a model accepting requests in this region.",
        ("region", "model"),
    ),
    MetricSpec(
        "firstlight.replica.queue_depth",
        "gauge",
        "{request}",
        "Requests on a replica, by state (running or waiting).",
        ("region", "model", "replica", "state"),
    ),
    MetricSpec(
        "firstlight.replica.kv_cache.usage",
        "gauge",
        "1",
        "Fraction of a replica's KV-cache blocks in use.",
        ("region", "model", "replica"),
    ),
    MetricSpec(
        "firstlight.replica.prefix_cache.queried_tokens",
        "observable_counter",
        "{token}",
        "Prompt tokens a replica looked up in its prefix cache.",
        ("region", "model", "replica"),
    ),
    MetricSpec(
        "firstlight.replica.prefix_cache.hit_tokens",
        "observable_counter",
        "{token}",
        "Of those, tokens found cached (hit ratio = rate(hit) / rate(queried)).",
        ("region", "model", "replica"),
    ),
    MetricSpec(
        "firstlight.replica.spec_decode.draft_tokens",
        "observable_counter",
        "{token}",
        "Speculative draft tokens proposed (0 when speculative decoding is off).",
        ("region", "model", "replica"),
    ),
    MetricSpec(
        "firstlight.replica.spec_decode.accepted_tokens",
        "observable_counter",
        "{token}",
        "Speculative draft tokens the target model accepted.",
        ("region", "model", "replica"),
    ),
    MetricSpec(
        "firstlight.replica.port.streams",
        "observable_counter",
        "{request}",
        "Streams the replica served on its own port (gateway.data_path: replica-port).",
        ("region", "model", "replica"),
    ),
    # --- prefix-cache hints -------------------------------------------------------------
    MetricSpec(
        "firstlight.hints.mirror.blocks",
        "gauge",
        "{block}",
        "(replica, block) entries in the gateway's hint mirror.",
        ("region", "model"),
    ),
    MetricSpec(
        "firstlight.hints.staleness",
        "gauge",
        "s",
        "Seconds since the hint feed was lost (0 while following it).",
        ("region", "model"),
    ),
    MetricSpec(
        "firstlight.hints.redis.up",
        "gauge",
        "1",
        "1 while the gateway follows the region's Redis hint feed, else 0 (absent "
        "when hints are off).",
        ("region",),
    ),
    # --- peers --------------------------------------------------------------------------
    MetricSpec(
        "firstlight.peer.rtt",
        "gauge",
        "s",
        "Measured round trip to a peer region's gateway (EWMA).",
        ("region", "peer"),
    ),
    MetricSpec(
        "firstlight.peer.up",
        "gauge",
        "1",
        "1 while a peer region is usable (breaker closed, fresh summary), else 0.",
        ("region", "peer"),
    ),
    # --- reliability ------------------------------------------------------------------
    MetricSpec(
        "firstlight.request.migrations",
        "observable_counter",
        "{attempt}",
        "Requests sent to another replica after theirs failed: outcome=retried (before "
        "the first token), resumed (a stream continued mid-way), gave_up (no attempt or "
        "no healthy replica left: the request failed over or ended with an error).",
        ("region", "model", "outcome"),
    ),
    MetricSpec(
        "firstlight.outliers",
        "counter",
        "{request}",
        "Successful requests whose time to first token (kind=ttft) or end-to-end time "
        "(kind=e2e) exceeded telemetry.outlier_factor times their model's rolling median "
        "at this gateway; each is logged in full on the firstlight.outliers logger.",
        ("region", "model", "kind"),
    ),
    MetricSpec(
        "firstlight.gateway.asyncio_tasks",
        "gauge",
        "{task}",
        "asyncio tasks alive on the gateway's event loop (a rise that outlasts the load "
        "is a leak).",
        ("region",),
    ),
    MetricSpec(
        "firstlight.gateway.metrics_shared",
        "gauge",
        "1",
        "1 while this gateway shares its metrics with the region's other gateways through "
        "Redis (a scrape of any gateway then shows all of them), 0 while it cannot.",
        ("region",),
    ),
    # --- objectives -------------------------------------------------------------------
    MetricSpec(
        "firstlight.slo.time_to_first_token",
        "gauge",
        "s",
        "The configured P95 time-to-first-token objective (router.slo.ttft_p95_ms).",
        ("region",),
    ),
    MetricSpec(
        "firstlight.slo.time_per_output_token",
        "gauge",
        "s",
        "The configured P95 time-per-output-token objective (router.slo.tpot_p95_ms).",
        ("region",),
    ),
)

_BY_NAME = {m.name: m for m in CATALOG}


def spec(name: str) -> MetricSpec:
    """The catalog entry of ``name``; ``KeyError`` for a name not in the catalog."""
    return _BY_NAME[name]
