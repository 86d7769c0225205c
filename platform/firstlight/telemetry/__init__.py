"""Telemetry: OpenTelemetry metrics (exported for Prometheus at ``/metrics``), traces
(OTLP when configured) and the rolling windows behind the built-in dashboard.

:mod:`~firstlight.telemetry.catalog` lists every metric; :class:`GatewayTelemetry` is
built once per gateway process; :func:`~firstlight.telemetry.tracing.build_tracer` once
per process (gateways and replicas).
"""

from firstlight.telemetry.catalog import CATALOG, MetricSpec
from firstlight.telemetry.metrics import GatewayTelemetry, RequestObservation

__all__ = ["CATALOG", "GatewayTelemetry", "MetricSpec", "RequestObservation"]
