"""The gateway's observable instruments: what a Prometheus scrape reads at that moment
(fallbacks, healthy replicas, the hint feed, peers, migrations, asyncio tasks, the SLO
targets). Built by :class:`~firstlight.telemetry.GatewayTelemetry`, which registers each
callback with its catalog instrument; each callback reads live state and keeps nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Observation

from firstlight.config import PlatformConfig

if TYPE_CHECKING:
    from firstlight.region import RouterState
    from firstlight.regions.peers import PeerTable

__all__ = ["Callback", "ScrapeObservers"]

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class ScrapeObservers:
    """The scrape-time callbacks of one gateway."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        states: Callable[[], Mapping[str, RouterState | None]],
        peers: PeerTable | None,
        migrations: Mapping[tuple[str, str], int],
        wall_clock: Callable[[], float],
        metrics_shared: Callable[[], bool | None] = lambda: None,
    ) -> None:
        self.config = config
        self.region = region
        self._states = states
        self._peers = peers
        self.migrations = migrations
        """Live: the telemetry's counts, read at each scrape."""
        self._wall = wall_clock
        self._metrics_shared = metrics_shared

    def callbacks(self) -> dict[str, Callback]:
        """Catalog name → the callback its observable instrument calls at scrape time."""
        return {
            "firstlight.route.fallbacks": self._observe_fallbacks,
            "firstlight.replicas.healthy": self._observe_healthy,
            "firstlight.hints.mirror.blocks": self._observe_mirror,
            "firstlight.hints.staleness": self._observe_staleness,
            "firstlight.hints.redis.up": self._observe_redis,
            "firstlight.peer.rtt": self._observe_peer_rtt,
            "firstlight.peer.up": self._observe_peer_up,
            "firstlight.request.migrations": self._observe_migrations,
            "firstlight.gateway.asyncio_tasks": self._observe_tasks,
            "firstlight.gateway.metrics_shared": self._observe_shared,
            "firstlight.route.share_up": self._observe_share_up,
            "firstlight.route.shared_events": self._observe_shared_events,
            "firstlight.slo.time_to_first_token": lambda _: [
                Observation(self.config.router.slo.ttft_p95_ms / 1000.0, {"region": self.region})
            ],
            "firstlight.slo.time_per_output_token": lambda _: [
                Observation(self.config.router.slo.tpot_p95_ms / 1000.0, {"region": self.region})
            ],
        }

    def _live_states(self) -> Iterable[tuple[str, RouterState]]:
        for model, state in self._states().items():
            if state is not None:
                yield model, state

    def _observe_fallbacks(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, state in self._live_states():
            yield Observation(state.fallbacks, {"region": self.region, "model": model})

    def _observe_healthy(self, _: CallbackOptions) -> Iterable[Observation]:
        # A model whose router does not exist yet has no healthy replica either.
        for model, state in self._states().items():
            healthy = 0 if state is None else state.healthy_replicas
            yield Observation(healthy, {"region": self.region, "model": model})

    def _observe_mirror(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, state in self._live_states():
            if state.hints_feed() is not None:
                yield Observation(state.hint_blocks(), {"region": self.region, "model": model})

    def _observe_staleness(self, _: CallbackOptions) -> Iterable[Observation]:
        now = self._wall()
        for model, state in self._live_states():
            feed = state.hints_feed()
            if feed is None:
                continue
            stale_s = 0.0 if feed.stale_since is None else max(now - feed.stale_since, 0.0)
            yield Observation(stale_s, {"region": self.region, "model": model})

    def _observe_redis(self, _: CallbackOptions) -> Iterable[Observation]:
        feeds = [s.hints_feed() for _, s in self._live_states()]
        known = [f for f in feeds if f is not None]
        if known:
            yield Observation(int(all(f.connected for f in known)), {"region": self.region})

    def _observe_peer_rtt(self, _: CallbackOptions) -> Iterable[Observation]:
        if self._peers is None:
            return
        for peer in self._peers.peers.values():
            if peer.summary_received_at is None:
                continue  # only the configured prior so far, nothing measured
            attrs = {"region": self.region, "peer": peer.region}
            yield Observation(peer.rtt_ms / 1000.0, attrs)

    def _observe_peer_up(self, _: CallbackOptions) -> Iterable[Observation]:
        if self._peers is None:
            return
        for peer in self._peers.peers.values():
            attrs = {"region": self.region, "peer": peer.region}
            yield Observation(int(self._peers.is_up(peer)), attrs)

    def _observe_migrations(self, _: CallbackOptions) -> Iterable[Observation]:
        for (model, outcome), count in self.migrations.items():
            attrs = {"region": self.region, "model": model, "outcome": outcome}
            yield Observation(count, attrs)

    def _observe_tasks(self, _: CallbackOptions) -> Iterable[Observation]:
        # Scrapes run on the gateway's event loop (the /metrics route); elsewhere (a
        # scrape from a plain thread, in tests) there is no loop to count.
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:
            return
        yield Observation(tasks, {"region": self.region})

    def _observe_share_up(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, state in self._live_states():
            share = state.route_share()
            if share is not None:
                yield Observation(int(share.connected), {"region": self.region, "model": model})

    def _observe_shared_events(self, _: CallbackOptions) -> Iterable[Observation]:
        for model, state in self._live_states():
            share = state.route_share()
            if share is None:
                continue
            for direction, count in (
                ("sent", share.sent),
                ("heard", share.heard),
                ("dropped", share.dropped),
            ):
                attrs = {"region": self.region, "model": model, "direction": direction}
                yield Observation(count, attrs)

    def _observe_shared(self, _: CallbackOptions) -> Iterable[Observation]:
        shared = self._metrics_shared()
        if shared is not None:  # None: a gateway without the shared scrape (tests)
            yield Observation(int(shared), {"region": self.region})
