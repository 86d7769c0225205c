"""``FirstlightRequestRouter``: Ray Serve's in-region replica choice, by the configured policy.

Ray Serve builds one router per deployment handle, in the process that holds the handle
(the region's gateway), and calls:

* :meth:`initialize_state` once, with ``request_router_kwargs`` from the app builder
  (:func:`router_kwargs`): the policy, its parameters, the region, the model and the
  hints settings. It starts the hint subscriber as a background task, and with several
  gateways per region the route share (:class:`~firstlight.serve.route_share.RouteShare`).
* :meth:`update_replicas` when the replica set changes (long poll).
* :meth:`choose_replicas` for every routing attempt: reads the
  :class:`~firstlight.routing.RequestView` the gateway passed as the ``routing`` keyword
  of the handle call; when the gateway committed the request's ticket
  (:class:`~firstlight.region.Ticket`) it returns that decision's ranking as tiers,
  without ranking again; otherwise (a caller without a ticket) it asks the policy with
  the replicas' routing stats, Ray's queue-length cache and the hint mirror. It never
  awaits anything: no Redis, no actor call.
* :meth:`on_request_routed` once Ray has sent the request: the policy reserves it.

The gateway reads what the router knows through :mod:`firstlight.region.state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from firstlight.config import HintsConfig
from firstlight.hints import HintMirror, HintSubscriber, redis_client
from firstlight.region import ReplicaStats, RouterState, routers, with_shared_rates
from firstlight.routing import NO_CACHE, RequestView, RoutingInput, build_policy
from firstlight.serve.route_share import RouteShare, route_channel

__all__ = ["FirstlightRequestRouter", "router_kwargs"]

_log = logging.getLogger(__name__)


def router_kwargs(
    *,
    region: str,
    model: str,
    policy: str,
    params: dict[str, Any],
    hints: HintsConfig | None,
    hint_key_prefix: str,
    share_routes: bool = False,
    replica_port: bool = False,
) -> dict[str, Any]:
    """The JSON-serializable ``request_router_kwargs`` the app builder passes to Ray
    (``replica_port``: the gateway streams from the replicas' ports, so Ray's
    queue-length cache, which counts only handle calls, does not describe the queues)."""
    return {
        "replica_port": replica_port,
        "region": region,
        "model": model,
        "policy": policy,
        "params": dict(params),
        "hints": hints.model_dump(mode="json") if hints is not None else None,
        "hint_key_prefix": hint_key_prefix,
        "share_routes": share_routes,
    }


class FirstlightRequestRouter(RequestRouter):
    """Ranks a model's replicas with the configured policy (see module docstring)."""

    _state: RouterState
    _subscriber_task: asyncio.Task[None] | None = None
    _share_task: asyncio.Task[None] | None = None
    route_share: RouteShare | None = None

    def initialize_state(self, **kwargs: Any) -> None:
        """Called once by Ray with :func:`router_kwargs`'s dict. Raises ``ConfigError``
        for an unknown policy or bad parameters (the app builder checked them first)."""
        region = str(kwargs["region"])
        model = str(kwargs["model"])
        policy = build_policy(
            str(kwargs["policy"]), kwargs.get("params") or {}, rng=random.Random(), clock=time.time
        )
        self._state = RouterState(region=region, model=model, policy=policy, clock=time.time)
        self._measured: set[str] = set()
        self._ray_queues = not kwargs.get("replica_port", False)
        hints = kwargs.get("hints")
        if hints is not None:
            config = HintsConfig.model_validate(hints)
            self._start_hints(config, str(kwargs["hint_key_prefix"]))
            if kwargs.get("share_routes"):
                channel = route_channel(str(kwargs["hint_key_prefix"]), model)
                self.route_share = RouteShare(lambda: redis_client(config), channel, self._state)
                self._share_task = self._loop().create_task(self.route_share.run())
        routers()[(self.app_name, self._deployment_id.name)] = self._state

    def _start_hints(self, hints: HintsConfig, key_prefix: str) -> None:
        mirror = HintMirror(hints.ttl_s)
        subscriber = HintSubscriber(
            lambda: redis_client(hints), key_prefix, self._state.model, mirror
        )
        self._state.cache = mirror

        def status() -> str:
            s = subscriber.status
            return "connected" if s.connected else f"stale since {s.stale_since}"

        self._state.hints_status = status
        self._state.hints_feed = lambda: subscriber.status
        self._subscriber_task = self._loop().create_task(subscriber.run())

    def _loop(self) -> asyncio.AbstractEventLoop:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return self._event_loop

    @property
    def state(self) -> RouterState:
        return self._state

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Ray's replica set changed (a replica started, or was removed by autoscaling or
        a failure): a removed replica's hints are dropped at once, not left to expire,
        and its calibration is forgotten, so a replica that takes its place starts clean."""
        super().update_replicas(replicas)
        dropped = self._state.replica_set(r.replica_id.unique_id for r in replicas)
        for gone, blocks in dropped.items():
            _log.info(
                "replica %s left %s: %d hinted blocks dropped", gone, self._state.model, blocks
            )
            self._measured.discard(gone)
        self._refresh_views(replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._refresh_views(list(self.curr_replicas.values()))

    def _refresh_views(self, replicas: list[RunningReplica]) -> None:
        views = {}
        self._state.stats = {
            r.replica_id.unique_id: ReplicaStats.from_wire(r.routing_stats)
            for r in replicas
            if r.routing_stats
        }
        for replica in replicas:
            rid = replica.replica_id.unique_id
            stats = self._state.stats.get(rid, ReplicaStats())
            if stats.accepting:
                queue_len = (
                    self._replica_queue_len_cache.get(replica.replica_id)
                    if self._ray_queues
                    else None
                )
                views[rid] = stats.view(rid, self._state.region, queue_len)
                if views[rid].prefill_tokens_per_s and rid not in self._measured:
                    self._measured.add(rid)
                    self._state.policy.on_replica_reset(rid)
        self._state.set_replicas(with_shared_rates(views))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Rank ``candidate_replicas`` for the pending request: one tier per replica,
        best first. Requests without a ``routing`` keyword (health probes, admin calls)
        get a single tier of all candidates, so Ray picks the shortest queue."""
        self._refresh_views(candidate_replicas)
        request = None if pending_request is None else pending_request.kwargs.get("routing")
        if not isinstance(request, RequestView) or not self._state.replicas:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        route = self._state.route_of(request.request_id)
        if route is not None and route.chosen is None:
            # The gateway committed this request's ticket: execute its decision.
            tiers = [[by_id[c.replica_id]] for c in route.decision.ranked if c.replica_id in by_id]
            if tiers:
                return tiers
        views = tuple(self._state.replicas.values())
        started = time.perf_counter()
        decision = self._state.policy.choose(
            RoutingInput(request, views, self._state.cache or NO_CACHE)
        )
        self._state.record_decision(request, decision, time.perf_counter() - started)
        return [[by_id[c.replica_id]] for c in decision.ranked if c.replica_id in by_id]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        request = pending_request.kwargs.get("routing")
        if isinstance(request, RequestView):
            self._state.record_routed(request.request_id, replica_id.unique_id)

    def __del__(self) -> None:
        for task in (self._subscriber_task, self._share_task):
            if task is not None and not task.done():
                with contextlib.suppress(RuntimeError):
                    task.cancel()
