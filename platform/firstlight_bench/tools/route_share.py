"""Route-share benchmark: how long one router's route takes to reach another over a real
Redis, and what announcing costs the router that routes.

Run ``firstlight bench route-share`` (options ``--redis-url URL --requests 2000 --rate 200
--out FILE --page PAGE``; Redis at ``--redis-url``, default the local one).
Two routers' :class:`~firstlight.serve.route_share.RouteShare` run in this process on a
channel of their own; router one routes ``--requests`` requests (``--rate`` per second,
each routed, given its first token and finished, as the gateway does), and the report
gives:

* ``delivery_ms``: p50/p90/p99/max from the moment router one recorded a route to the
  moment router two applied it (both routers share this process's event loop, so this
  includes waiting for it: an upper bound of two separate gateways' hop);
* ``record_routed_us``: the router's own bookkeeping per route (``record_routed``, the
  decision path) with the share and without it, p50, measured side by side.

``firstlight bench sim --route-share-ms`` takes the share's delay as a parameter; this is
where its default comes from. ``--out`` stores the JSON report as that file (not a
folder); ``--page`` rewrites that page's ``route-share`` section from it
(:func:`render_share`; a test holds ``docs/serving.md`` to
``docs/benchmarks/route-share/results.json``).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from redis.asyncio import Redis

from firstlight.quantiles import percentile
from firstlight.region import RouteEvent, RouterState
from firstlight.routing import ReplicaView, RequestView, RoutingInput, build_policy
from firstlight.serve.route_share import RouteShare, route_channel
from firstlight_bench.options import PageOption, command_line, page_needs_out
from firstlight_bench.reports.results import git_commit, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit

__all__ = ["SHARE_BEGIN", "SHARE_END", "app", "measure", "render_share"]

SHARE_BEGIN = (
    "<!-- route-share:begin (generated from docs/benchmarks/route-share/results.json; "
    "do not edit) -->"
)
SHARE_END = "<!-- route-share:end -->"
_REPLICAS = 8
_BLOCKS = 64
"""Block hashes per request: a 2,048-token prompt at 32 tokens per block."""


def _state() -> RouterState:
    policy = build_policy("firstlight", {}, rng=random.Random(0), clock=time.time)
    state = RouterState("bench", "m", policy, clock=time.time)
    views = {f"r{i}": ReplicaView(f"r{i}", "bench", queue_len=0) for i in range(_REPLICAS)}
    state.set_replicas(views)
    return state


def _request(i: int) -> RequestView:
    return RequestView(f"q{i}", _BLOCKS * 32, tuple(range(i, i + _BLOCKS)), 32)


def _route(state: RouterState, request: RequestView) -> float:
    """Decide and record one route; returns ``record_routed``'s time in µs."""
    decision = state.policy.choose(
        RoutingInput(request, tuple(state.replicas.values()), state.cache)
    )
    state.record_decision(request, decision)
    began = time.perf_counter_ns()
    state.record_routed(request.request_id, decision.winner.replica_id)
    return (time.perf_counter_ns() - began) / 1000.0


async def measure(redis_url: str, requests: int, rate: float) -> dict[str, Any]:
    """Run the measurement (see the module docstring); raises what Redis raises if it
    cannot be reached within 10 s."""
    channel = route_channel(f"bench-{uuid.uuid4().hex[:8]}:", "m")
    sender, receiver = _state(), _state()
    one = RouteShare(lambda: Redis.from_url(redis_url), channel, sender)
    two = RouteShare(lambda: Redis.from_url(redis_url), channel, receiver)
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}
    apply = receiver.apply_peer_route

    def timed_apply(event: RouteEvent, router: str = "") -> None:
        if event.stage == "routed":
            arrived[event.request_id] = time.perf_counter()
        apply(event, router)

    receiver.apply_peer_route = timed_apply  # type: ignore[method-assign]
    tasks = [asyncio.create_task(share.run()) for share in (one, two)]
    probe = Redis.from_url(redis_url)
    try:
        await _until(_connected(one, two), "both routers connected")

        async def subscribed() -> bool:
            return dict(await probe.pubsub_numsub(channel)).get(channel.encode(), 0) == 2

        await _until(subscribed, "both routers subscribed")
        shared_us, alone_us = [], []
        alone = _state()
        for i in range(requests):
            request = _request(i)
            # In turn first and second: the first route after a wake-up runs on cold caches.
            if i % 2:
                alone_us.append(_route(alone, _request(i)))
            sent[request.request_id] = time.perf_counter()
            shared_us.append(_route(sender, request))
            if not i % 2:
                alone_us.append(_route(alone, _request(i)))
            await asyncio.sleep(1.0 / rate)
            sender.first_token(request.request_id, 10.0)
            sender.finished(request.request_id)
            alone.finished(request.request_id)

        async def all_arrived() -> bool:  # routed, first token and done of each
            return two.applied >= 3 * requests

        await _until(all_arrived, "every announcement arrived")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await probe.aclose()
    delivery = sorted((arrived[rid] - at) * 1000.0 for rid, at in sent.items())
    return {
        "delivery_ms": {
            "p50": _pct(delivery, 0.5, 3),
            "p90": _pct(delivery, 0.9, 3),
            "p99": _pct(delivery, 0.99, 3),
            "max": round(delivery[-1], 3),
        },
        "record_routed_us": {
            "shared_p50": _pct(sorted(shared_us), 0.5, 1),
            "alone_p50": _pct(sorted(alone_us), 0.5, 1),
        },
        "events": {"published": one.published, "applied": two.applied, "dropped": one.dropped},
    }


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``condition`` every 10 ms for up to 10 s; raises ``TimeoutError`` naming
    ``what`` when it never holds."""
    for _ in range(1000):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"route-share benchmark: not {what} within 10 s")


def _pct(values: list[float], q: float, digits: int) -> float:
    value = percentile(values, q)
    assert value is not None  # values is never empty here
    return round(value, digits)


def _connected(*shares: RouteShare) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(share.connected for share in shares)

    return check


def render_share(report: dict[str, Any]) -> str:
    """The ``route-share`` section of ``docs/serving.md``, headed by how it was measured."""
    meta, delivery, cost = report["meta"], report["delivery_ms"], report["record_routed_us"]
    lines = [
        SHARE_BEGIN,
        "",
        f"`{meta['command']}` at commit `{short_commit(meta['git_commit'])}` "
        f"({meta['options']['requests']} routes at {meta['options']['rate']:g}/s, "
        f"{meta['cpu_count']} cores, both routers in one process):",
        "",
        "| route reaches the other router, p50 | p90 | p99 | max "
        "| `record_routed` with the share, p50 | without, p50 |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {delivery['p50']:.2f} ms | {delivery['p90']:.2f} ms | {delivery['p99']:.2f} ms "
        f"| {delivery['max']:.2f} ms | {cost['shared_p50']:.1f} µs | {cost['alone_p50']:.1f} µs |",
        "",
        SHARE_END,
    ]
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


@app.command()
def route_share(
    redis_url: Annotated[str, typer.Option(help="The Redis both routers share.")] = (
        "redis://127.0.0.1:6379/0"
    ),
    requests: Annotated[int, typer.Option(min=1, help="Routes router one records.")] = 2000,
    rate: Annotated[
        float, typer.Option(max=100_000, help="Routes per second, in (0, 100000].")
    ] = 200.0,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON report to this file.")
    ] = None,
    page: PageOption = None,
) -> None:
    """How fast one router's routes reach another over Redis, and what announcing costs
    the router that routes: prints the JSON report, writes it to --out, rewrites --page's
    route-share section. Run by a maintainer to refresh docs/serving.md."""
    if rate <= 0:
        raise typer.BadParameter(f"{rate:g}: routes per second above 0", param_hint="--rate")
    page_needs_out(out, page)
    measured = asyncio.run(measure(redis_url, requests, rate))
    report = {
        "meta": {
            "command": command_line(),
            "git_commit": git_commit(),
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(),
            "options": {"requests": requests, "rate": rate},
        },
        **measured,
    }
    emit(report, out)
    if page is not None:
        page.write_text(
            replace_tables(page.read_text(), render_share(report), begin=SHARE_BEGIN, end=SHARE_END)
        )
