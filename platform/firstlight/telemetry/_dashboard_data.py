"""The dashboard's rolling data of one gateway process: :class:`DashboardData`, the base of
:class:`~firstlight.telemetry.GatewayTelemetry`.

Per model, the TTFT and inter-token samples and the route counts of the last
``window_s`` seconds (:mod:`firstlight.telemetry.rolling`), the last routing decisions,
and the replicas' prefix-cache hit ratios over the dashboard's polls. The telemetry
writes them as each request finishes (:meth:`GatewayTelemetry.finish
<firstlight.telemetry.GatewayTelemetry.finish>` adds the samples and logs the decision);
the dashboard reads them (:func:`firstlight.dashboard.dashboard_state`), this gateway's
through :meth:`DashboardData.window`, which
:class:`~firstlight.telemetry.gateways.ExpositionShare` also hands the region's other
gateways. Nothing here is a metric: ``/metrics`` never reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from firstlight.config import PlatformConfig
from firstlight.telemetry.observation import RequestObservation
from firstlight.telemetry.rolling import (
    CounterRatio,
    DecisionRecord,
    RollingCounts,
    RollingSamples,
)
from firstlight.telemetry.windows import GatewayWindow, ModelWindow

if TYPE_CHECKING:
    from firstlight.region import ReplicaStats

__all__ = ["DashboardData"]

_DECISION_LOG = 30
_WINDOW_S = 300.0


class DashboardData:
    """The rolling windows, decision log and hit-ratio trackers of one gateway process
    (see the module docstring), for ``config``'s models; ``clock`` times the windows,
    ``wall_clock`` stamps the decisions."""

    def __init__(
        self,
        config: PlatformConfig,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._wall = wall_clock
        # The dashboard's rolling windows, per model.
        self.ttft = {m.name: RollingSamples(_WINDOW_S, clock=clock) for m in config.models}
        self.itl = {m.name: RollingSamples(_WINDOW_S, clock=clock) for m in config.models}
        self.routes = {m.name: RollingCounts(_WINDOW_S, clock=clock) for m in config.models}
        self.hit_ratios: dict[tuple[str, str], CounterRatio] = {}
        self._hit_seen: set[tuple[str, str]] = set()
        self._clock = clock
        self._started = clock()
        self.window_s = _WINDOW_S
        """Span of the dashboard's rolling percentiles and counts, seconds."""
        self.decisions: list[DecisionRecord] = []
        """The last routing decisions, newest first (the dashboard lists them)."""
        self.decisions_kept = _DECISION_LOG
        """How many decisions :attr:`decisions` keeps (and the dashboard lists)."""

    def observed_window_s(self) -> float:
        """The rolling window, or less while this gateway is younger than it (rates)."""
        return max(min(self.window_s, self._clock() - self._started), 1.0)

    def _log_decision(self, obs: RequestObservation, route: str) -> None:
        observed = obs.observed_ttft_ms
        if observed is None and obs.first_token_at is not None:
            observed = (obs.first_token_at - obs.started) * 1000.0
        record = DecisionRecord(
            at=self._wall(),
            model=obs.model,
            route=route,
            region=obs.served_region,
            replica=obs.replica,
            predicted_ttft_ms=obs.predicted_ttft_ms,
            observed_ttft_ms=observed,
            explanation=obs.explanation,
        )
        self.decisions.insert(0, record)
        del self.decisions[_DECISION_LOG:]

    def window(self, gateway: str) -> GatewayWindow:
        """This gateway's rolling windows as one record (the dashboard merges every
        gateway's: :mod:`firstlight.telemetry.windows`)."""
        models = {
            name: ModelWindow(
                tuple(self.ttft[name].values()),
                tuple(self.itl[name].values()),
                dict(self.routes[name].counts()),
            )
            for name in self.ttft
        }
        return GatewayWindow(gateway, self.observed_window_s(), models, tuple(self.decisions))

    def forget_other_replicas(self) -> None:
        """Drop the hit-ratio trackers of replicas not asked about since the last call
        (the dashboard calls it after each poll, so gone replicas do not pile up)."""
        for key in set(self.hit_ratios) - self._hit_seen:
            del self.hit_ratios[key]
        self._hit_seen = set()

    def replica_hit_ratio(self, model: str, replica: str, stats: ReplicaStats) -> float | None:
        """The replica's token-weighted prefix-cache hit ratio (dashboard): over the last
        minute of polls, or since the replica started until two polls are that far
        apart; ``None`` while it looked nothing up."""
        tracker = self.hit_ratios.get((model, replica))
        if tracker is None:
            tracker = self.hit_ratios[(model, replica)] = CounterRatio(clock=self._clock)
        hits = float(stats.prefix_cache_hits)
        queries = float(stats.prefix_cache_queries)
        tracker.observe(hits, queries)
        self._hit_seen.add((model, replica))
        if tracker.covers_window():
            return tracker.ratio()
        return hits / queries if queries > 0 else None
