"""Rolling windows for the built-in dashboard: percentiles, counts and a decision log.

Prometheus computes percentiles from histogram buckets over its own windows; the
built-in dashboard has no Prometheus behind it, so each gateway keeps the raw samples
of the last ``window_s`` seconds (bounded in count) and computes exact percentiles on
demand. Written by :class:`firstlight.telemetry.GatewayTelemetry` per request, read by
:mod:`firstlight.dashboard.state` per dashboard poll. Pure and synchronous; the clock
is injected.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from firstlight.quantiles import percentile

__all__ = ["CounterRatio", "DecisionRecord", "RollingCounts", "RollingSamples"]


class RollingSamples:
    """Samples of the last ``window_s`` seconds, at most ``max_samples`` (the oldest go
    first)."""

    def __init__(
        self,
        window_s: float = 300.0,
        max_samples: int = 20_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, value: float) -> None:
        self._samples.append((self._clock(), value))

    def values(self) -> list[float]:
        self._expire()
        return [v for _, v in self._samples]

    def summary(self, quantiles: Iterable[float] = (0.5, 0.95, 0.99)) -> dict[str, float | None]:
        """``{"p50": ..., "p95": ..., "p99": ..., "count": n}`` over the window."""
        values = sorted(self.values())
        out: dict[str, float | None] = {
            f"p{round(q * 100)}": percentile(values, q) for q in quantiles
        }
        out["count"] = float(len(values))
        return out

    def _expire(self) -> None:
        horizon = self._clock() - self._window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()


class RollingCounts:
    """Event counts by key over the last ``window_s`` seconds."""

    def __init__(
        self,
        window_s: float = 300.0,
        max_events: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._events: deque[tuple[float, str]] = deque(maxlen=max_events)

    def add(self, key: str) -> None:
        self._events.append((self._clock(), key))

    def counts(self) -> Counter[str]:
        horizon = self._clock() - self._window_s
        while self._events and self._events[0][0] < horizon:
            self._events.popleft()
        return Counter(key for _, key in self._events)


class CounterRatio:
    """A recent ratio of two cumulative counters (e.g. prefix-cache hit tokens over
    queried tokens): the increase of each over the last ``window_s`` seconds of
    observations. A counter that went down (the replica restarted) starts afresh."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._window_s = window_s
        self._clock = clock
        self._points: deque[tuple[float, float, float]] = deque()

    def observe(self, numerator: float, denominator: float) -> None:
        now = self._clock()
        if self._points and (numerator < self._points[-1][1] or denominator < self._points[-1][2]):
            self._points.clear()
        self._points.append((now, numerator, denominator))
        # Keep one point at or before the horizon, so the window is fully covered.
        horizon = now - self._window_s
        while len(self._points) > 2 and self._points[1][0] <= horizon:
            self._points.popleft()

    def covers_window(self) -> bool:
        """Whether the observations span at least ``window_s`` (else the ratio is over
        a shorter time)."""
        return len(self._points) >= 2 and (
            self._points[-1][0] - self._points[0][0] >= self._window_s
        )

    def ratio(self) -> float | None:
        """Increase of the numerator over increase of the denominator; ``None`` when
        the denominator did not move (nothing was looked up)."""
        if len(self._points) < 2:
            return None
        _, num0, den0 = self._points[0]
        _, num1, den1 = self._points[-1]
        if den1 <= den0:
            return None
        return (num1 - num0) / (den1 - den0)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One routing decision as the dashboard lists it (no prompt, no key)."""

    at: float
    """Wall-clock seconds."""
    model: str
    route: str
    """``local``, ``spill_over``, ``fail_over``, ``from_peer`` or ``rejected``."""
    region: str | None
    """Where it was served."""
    replica: str | None
    predicted_ttft_ms: float | None
    observed_ttft_ms: float | None
    explanation: str | None
