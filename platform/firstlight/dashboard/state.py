"""The built-in dashboard's data (``GET /dashboard/api/state``) and its page.

The gateway's routes call :func:`dashboard_state` on every poll (every 2 s per open
page): it reads what the gateway already holds — the model routers' state (replicas and
their last routing stats), the peer table, this region's summary — and the rolling
windows of every gateway of the region, which the caller fetched
(:meth:`~firstlight.telemetry.gateways.ExpositionShare.windows`) and it merges
(:func:`~firstlight.telemetry.windows.merge_windows`), and this gateway's own outliers
and prefix-cache advisor ledger (:mod:`firstlight.advisor`); it does no I/O. :func:`page`
returns the static page shipped in the package (``static/index.html``: no CDN, works
offline), which polls the JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from firstlight.quantiles import percentile
from firstlight.telemetry.outliers import OutlierRecord, record_json
from firstlight.telemetry.windows import MergedModel, merge_windows

if TYPE_CHECKING:  # the gateway imports this module: no import cycle at run time
    from firstlight.config import PlatformConfig
    from firstlight.region.state import RouterState
    from firstlight.regions.peers import PeerTable
    from firstlight.regions.summary import RegionSummary
    from firstlight.telemetry import GatewayTelemetry
    from firstlight.telemetry.windows import GatewayWindow

__all__ = ["dashboard_state", "page"]

_ROUTES = ("local", "spill_over", "fail_over", "from_peer", "rejected")


@cache
def page() -> str:
    """The dashboard's HTML (read once from the package)."""
    return resources.files("firstlight.dashboard").joinpath("static/index.html").read_text()


def dashboard_state(
    config: PlatformConfig,
    region: str,
    states: Mapping[str, RouterState | None],
    peers: PeerTable,
    summary: RegionSummary,
    telemetry: GatewayTelemetry,
    windows: Sequence[GatewayWindow] | None = None,
) -> dict[str, Any]:
    """The JSON the dashboard page renders (schema in ``docs/observability.md``).
    ``windows``: every live gateway's rolling windows, this one's included; ``None``:
    this gateway's alone (named ``local``). The outliers are the ones this gateway
    captured, newest first; ``advisor`` holds the rows of this gateway's prefix-cache
    advisor ledger (:attr:`GatewayTelemetry.advisor`, the requests it served; not merged
    over the region's gateways), every caller group's, the row with most to recover per
    request first."""
    now = time.time()
    names = [m.name for m in config.models]
    merged = merge_windows(
        [telemetry.window("local")] if windows is None else windows,
        names,
        telemetry.decisions_kept,
    )
    models = [
        _model(config, name, states.get(name), telemetry, merged.models[name], now)
        for name in names
    ]
    telemetry.forget_other_replicas()
    return {
        "region": region,
        "generated_at": now,
        "window_s": telemetry.window_s,
        "gateways": list(merged.gateways),
        "simulated": any(m.engine == "sim" for m in config.models),
        "regions": [_local_region(region, summary), *_peer_regions(peers)],
        "models": models,
        "decisions": [
            {
                "at": d.at,
                "model": d.model,
                "route": d.route,
                "region": d.region,
                "replica": d.replica,
                "predicted_ttft_ms": d.predicted_ttft_ms,
                "observed_ttft_ms": d.observed_ttft_ms,
                "explanation": d.explanation,
            }
            for d in merged.decisions
        ],
        "outlier_factor": config.telemetry.outlier_factor,
        "trace_url": config.telemetry.trace_url,
        "outliers": [_outlier(o) for o in telemetry.outliers],
        "advisor": [row.to_json() for row in telemetry.advisor.report()],
    }


def _outlier(record: OutlierRecord) -> dict[str, Any]:
    """One captured outlier (this gateway's: :attr:`GatewayTelemetry.outliers`) with
    every field of its log line but the request id: the dashboard needs no API key, so
    it names no request (the trace id leads to it where traces are kept). Non-finite
    numbers are ``null`` (strict JSON)."""
    out: dict[str, Any] = json.loads(record_json(record))
    del out["request_id"]
    return out


def _local_region(region: str, summary: RegionSummary) -> dict[str, Any]:
    return {
        "name": region,
        "local": True,
        "up": all(m.healthy_replicas > 0 for m in summary.models.values()),
        "rtt_ms": 0.0,
        "breaker": "closed",
        "summary_age_s": 0.0,
        "models": _summary_models(summary),
    }


def _peer_regions(peers: PeerTable) -> list[dict[str, Any]]:
    out = []
    for peer in peers.peers.values():
        age = peers.summary_age_s(peer)
        out.append(
            {
                "name": peer.region,
                "local": False,
                "up": peers.is_up(peer),
                "rtt_ms": peer.rtt_ms if age is not None else None,
                "breaker": peer.breaker.state,
                "summary_age_s": age,
                "last_error": peer.last_error,
                "models": _summary_models(peer.summary) if peer.summary is not None else {},
            }
        )
    return out


def _summary_models(summary: RegionSummary) -> dict[str, Any]:
    return {
        name: {
            "healthy_replicas": m.healthy_replicas,
            "predicted_wait_ms": m.predicted_wait_ms,
        }
        for name, m in summary.models.items()
    }


def _model(
    config: PlatformConfig,
    name: str,
    state: RouterState | None,
    telemetry: GatewayTelemetry,
    window: MergedModel,
    now: float,
) -> dict[str, Any]:
    model = next(m for m in config.models if m.name == name)
    routes = window.routes
    replicas = []
    if state is not None:
        for replica, stats in sorted(state.stats.items()):
            replicas.append(
                {
                    "id": replica,
                    "queue_depth": stats.running + stats.waiting,
                    "running": stats.running,
                    "waiting": stats.waiting,
                    "kv_cache_usage": stats.kv_cache_usage,
                    "hit_ratio": telemetry.replica_hit_ratio(name, replica, stats),
                    "prefill_tokens_per_s": stats.prefill_tokens_per_s or None,
                    "accepting": stats.accepting,
                    "stats_age_s": max(now - (stats.at or now), 0.0),
                }
            )
    return {
        "name": name,
        "engine": model.engine,
        "simulated": model.engine == "sim",
        "policy": config.router.policy,
        "hints": {
            "status": "off" if state is None else state.hints_status(),
            "blocks": 0 if state is None else state.hint_blocks(),
        },
        "ttft_ms": _summary(window.ttft_ms),
        "itl_ms": _summary(window.itl_ms),
        "routes": {route: routes.get(route, 0) for route in _ROUTES},
        "requests_per_min": window.requests_per_min,
        "slo_ttft_p95_ms": config.router.slo.ttft_p95_ms,
        "replicas": replicas,
    }


def _summary(sorted_values: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p95/p99 (the project's one percentile) and the count of sorted samples."""
    out: dict[str, float | int | None] = {
        f"p{round(q * 100)}": percentile(sorted_values, q) for q in (0.5, 0.95, 0.99)
    }
    out["count"] = len(sorted_values)
    return out
