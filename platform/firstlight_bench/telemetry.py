"""Telemetry benchmark: what metrics cost per request, and what a scrape costs.

Run ``python -m firstlight_bench.telemetry [--requests 20000] [--replicas 1,16,64]``.
In this process, no Ray: a :class:`~firstlight.telemetry.GatewayTelemetry` for one model
records ``--requests`` requests the way the gateway does (start → route → first token →
routed → finish), with metrics on and with ``telemetry.metrics_enabled: false`` (the
dashboard's rolling windows only), alternating in blocks so both see the same machine
state; then ``/metrics`` is rendered with router states holding ``--replicas`` replicas.
Traces are off (no endpoint), as in the default configuration. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from firstlight.config import PlatformConfig, parse_config
from firstlight.region import ReplicaStats, RouterState
from firstlight.routing import build_policy
from firstlight.telemetry import GatewayTelemetry

__all__ = ["main", "per_request_us", "render_ms"]

_MODEL = "bench-model"


def _config(metrics: bool) -> PlatformConfig:
    return parse_config(
        {
            "mode": "local",
            "models": [{"name": _MODEL, "engine": "sim"}],
            "telemetry": {"metrics_enabled": metrics},
        },
        "bench",
    )


def _state(replicas: int) -> RouterState:
    policy = build_policy("firstlight", {}, rng=random.Random(0), clock=time.time)
    state = RouterState(region="bench", model=_MODEL, policy=policy)
    state.stats = {
        f"replica-{i:03d}": ReplicaStats(
            at=time.time(),
            running=i % 7,
            waiting=i % 3,
            kv_cache_usage=0.5,
            prefix_cache_queries=1000 * i,
            prefix_cache_hits=700 * i,
        )
        for i in range(replicas)
    }
    return state


def _record(telemetry: GatewayTelemetry, n: int) -> float:
    """Seconds to record ``n`` requests."""
    started = time.perf_counter()
    for _ in range(n):
        obs = telemetry.start("chat")
        obs.model = _MODEL
        obs.input_tokens = 256
        telemetry.begin_route(obs, "local")
        obs.first_token()
        telemetry.routed(_MODEL, 5e-5, 120.0, 130.0)
        obs.output_tokens = 32
        telemetry.finish(obs)
    return time.perf_counter() - started


def per_request_us(requests: int, blocks: int = 10) -> dict[str, float]:
    """Median per-request recording cost in µs, metrics on and off, over ``blocks``
    alternating blocks of ``requests / blocks`` requests each."""
    on = GatewayTelemetry(_config(True), "bench", lambda: {}, None)
    off = GatewayTelemetry(_config(False), "bench", lambda: {}, None)
    size = max(requests // blocks, 1)
    _record(on, size)  # warm-up
    _record(off, size)
    samples: dict[str, list[float]] = {"metrics_on": [], "metrics_off": []}
    for _ in range(blocks):
        samples["metrics_on"].append(_record(on, size) / size * 1e6)
        samples["metrics_off"].append(_record(off, size) / size * 1e6)
    on.shutdown()
    off.shutdown()
    return {name: statistics.median(values) for name, values in samples.items()}


def render_ms(replicas: int, repeats: int = 20) -> float:
    """Median time to render ``/metrics`` with ``replicas`` replicas reporting."""
    state = _state(replicas)
    telemetry = GatewayTelemetry(_config(True), "bench", lambda: {_MODEL: state}, None)
    _record(telemetry, 100)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        telemetry.render()
        times.append((time.perf_counter() - started) * 1000.0)
    telemetry.shutdown()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--replicas", default="1,16,64", help="replica counts for render")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "per_request_us": per_request_us(args.requests),
        "render_ms": {n: render_ms(int(n)) for n in args.replicas.split(",")},
        "python": sys.version.split()[0],
    }
    cost = report["per_request_us"]
    print(f"per request: metrics on {cost['metrics_on']:.1f} µs, off {cost['metrics_off']:.1f} µs")
    for replicas, ms in report["render_ms"].items():
        print(f"/metrics render, {replicas:>3} replicas: {ms:.2f} ms")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
