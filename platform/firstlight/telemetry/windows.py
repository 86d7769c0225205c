"""The built-in dashboard's rolling windows of one gateway, as a record other gateways read.

A region runs several gateways and HAProxy hands each dashboard poll to any of them, so
one gateway's rolling windows (:mod:`firstlight.telemetry.rolling`) would show a share of
the region's traffic, a different share on every poll. Each gateway therefore describes
its windows as a :class:`GatewayWindow` — the raw TTFT and inter-token samples (so the
merged percentiles stay exact), the route counts, the span they cover and the last
decisions — and the gateway answering a poll merges every live gateway's
(:func:`merge_windows`). The exchange goes through Redis
(:class:`~firstlight.telemetry.gateways.ExpositionShare`), only while a dashboard is
open.

Who calls what: :meth:`GatewayTelemetry.window <firstlight.telemetry.GatewayTelemetry.window>`
builds this gateway's record; ``ExpositionShare`` encodes and decodes records
(:func:`encode_window`, :func:`decode_window`); :func:`firstlight.dashboard.dashboard_state`
renders the merge. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from firstlight.telemetry.rolling import DecisionRecord

__all__ = [
    "GatewayWindow",
    "MalformedWindowError",
    "MergedModel",
    "MergedWindows",
    "ModelWindow",
    "decode_window",
    "encode_window",
    "merge_windows",
]

_FORMAT = 1
"""Bumped when the encoding changes; a record of another format is malformed."""


class MalformedWindowError(ValueError):
    """Bytes that are not a :func:`encode_window` record of this format."""


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """One model's rolling window at one gateway."""

    ttft_ms: tuple[float, ...] = ()
    itl_ms: tuple[float, ...] = ()
    routes: Mapping[str, int] = field(default_factory=dict)
    """Requests by route (``local``, ``spill_over``, ...) within the window."""


@dataclass(frozen=True, slots=True)
class GatewayWindow:
    """One gateway's rolling windows (see the module docstring)."""

    gateway: str
    observed_window_s: float
    """The span the samples and counts cover (less than the window while the gateway is
    younger than it): rates divide by it."""
    models: Mapping[str, ModelWindow]
    decisions: tuple[DecisionRecord, ...] = ()
    """The gateway's last decisions, newest first."""


@dataclass(frozen=True, slots=True)
class MergedModel:
    """One model over every gateway merged."""

    ttft_ms: list[float]
    """Sorted."""
    itl_ms: list[float]
    """Sorted."""
    routes: Counter[str]
    requests_per_min: float
    """The sum of each gateway's rate over its own observed span."""


@dataclass(frozen=True, slots=True)
class MergedWindows:
    """The region's dashboard windows: what :func:`merge_windows` returns."""

    gateways: tuple[str, ...]
    """The gateways merged, sorted."""
    models: Mapping[str, MergedModel]
    decisions: tuple[DecisionRecord, ...]
    """Newest first, at most the ``decisions`` asked for."""


def merge_windows(
    windows: Sequence[GatewayWindow], models: Sequence[str], decisions: int
) -> MergedWindows:
    """``windows`` (one per gateway; a gateway's second record is ignored) merged per
    model of ``models``: samples pooled, counts summed, rates added, and the newest
    ``decisions`` decisions of all gateways."""
    seen: dict[str, GatewayWindow] = {}
    for window in windows:
        seen.setdefault(window.gateway, window)
    merged: dict[str, MergedModel] = {}
    for name in models:
        parts = [(w, w.models.get(name, ModelWindow())) for w in seen.values()]
        routes: Counter[str] = Counter()
        for _, part in parts:
            routes.update(part.routes)
        merged[name] = MergedModel(
            ttft_ms=sorted(v for _, part in parts for v in part.ttft_ms),
            itl_ms=sorted(v for _, part in parts for v in part.itl_ms),
            routes=routes,
            requests_per_min=sum(
                sum(part.routes.values()) * 60.0 / max(w.observed_window_s, 1.0)
                for w, part in parts
            ),
        )
    newest = sorted(
        (d for w in seen.values() for d in w.decisions), key=lambda d: d.at, reverse=True
    )
    return MergedWindows(tuple(sorted(seen)), merged, tuple(newest[:decisions]))


def encode_window(window: GatewayWindow) -> bytes:
    """``window`` as compressed JSON (samples rounded to microseconds)."""
    data = {
        "format": _FORMAT,
        "gateway": window.gateway,
        "observed_window_s": window.observed_window_s,
        "models": {
            name: {
                "ttft_ms": [round(v, 3) for v in m.ttft_ms],
                "itl_ms": [round(v, 3) for v in m.itl_ms],
                "routes": dict(m.routes),
            }
            for name, m in window.models.items()
        },
        "decisions": [
            [
                d.at,
                d.model,
                d.route,
                d.region,
                d.replica,
                d.predicted_ttft_ms,
                d.observed_ttft_ms,
                d.explanation,
            ]
            for d in window.decisions
        ],
    }
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 1)


def decode_window(blob: bytes) -> GatewayWindow:
    """The record :func:`encode_window` made; :class:`MalformedWindowError` for
    anything else."""
    try:
        data: Any = json.loads(zlib.decompress(blob))
        if data["format"] != _FORMAT:
            raise MalformedWindowError(f"format {data['format']!r}, expected {_FORMAT}")
        models = {
            str(name): ModelWindow(
                ttft_ms=tuple(float(v) for v in m["ttft_ms"]),
                itl_ms=tuple(float(v) for v in m["itl_ms"]),
                routes={str(k): int(v) for k, v in m["routes"].items()},
            )
            for name, m in data["models"].items()
        }
        decisions = tuple(
            DecisionRecord(
                at=float(at),
                model=str(model),
                route=str(route),
                region=_optional_str(region),
                replica=_optional_str(replica),
                predicted_ttft_ms=_optional_float(predicted),
                observed_ttft_ms=_optional_float(observed),
                explanation=_optional_str(explanation),
            )
            for at, model, route, region, replica, predicted, observed, explanation in data[
                "decisions"
            ]
        )
        return GatewayWindow(
            str(data["gateway"]), float(data["observed_window_s"]), models, decisions
        )
    except MalformedWindowError:
        raise
    except (zlib.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MalformedWindowError(f"not a gateway window record: {exc}") from exc


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
