"""The route share over a real Redis (6379): two routers' RouteShares on one channel, each
applying the other's routes and never its own; with Redis unreachable nothing blocks and
what could not be sent is counted. No Ray cluster is started."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from firstlight._ports import free_port
from firstlight.hints import Backoff
from firstlight.region import RouteBatch, RouteEvent, RouterState, encode_routes
from firstlight.routing import ReplicaView, RequestView, RoutingInput, build_policy
from firstlight.serve.route_share import RouteShare, route_channel
from tests.conftest import FakeClock
from tests.hints.conftest import eventually

REGION = "us-east"


def _state(clock: FakeClock) -> RouterState:
    policy = build_policy("firstlight", {}, rng=random.Random(0), clock=clock)
    state = RouterState(REGION, "m", policy, clock=clock)
    state.set_replicas({"a": ReplicaView("a", REGION, queue_len=0, stats_at=0.0)})
    return state


def _route(state: RouterState, request_id: str) -> None:
    request = RequestView(request_id, 500, block_hashes=(11, 22), block_size=32)
    decision = state.policy.choose(RoutingInput(request, tuple(state.replicas.values())))
    state.record_decision(request, decision)
    state.record_routed(request_id, "a")


@pytest.fixture
async def shares() -> AsyncIterator[tuple[RouteShare, RouteShare, Redis]]:
    clock = FakeClock()
    channel = route_channel(f"test-{uuid.uuid4().hex[:8]}:", "m")
    one = RouteShare(lambda: Redis.from_url("redis://127.0.0.1:6379/0"), channel, _state(clock))
    two = RouteShare(lambda: Redis.from_url("redis://127.0.0.1:6379/0"), channel, _state(clock))
    tasks = [asyncio.create_task(s.run()) for s in (one, two)]
    await eventually(lambda: one.connected and two.connected)
    raw = Redis.from_url("redis://127.0.0.1:6379/0")

    async def subscribed() -> bool:  # Redis counts both subscriptions on the channel
        return dict(await raw.pubsub_numsub(channel)).get(channel.encode(), 0) == 2

    await eventually(subscribed)
    yield one, two, raw
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await raw.aclose()


async def test_each_router_hears_the_others_routes_to_the_end(
    shares: tuple[RouteShare, RouteShare, Redis],
) -> None:
    one, two, _ = shares
    other = two.state
    _route(one.state, "q1")
    await eventually(lambda: "q1" in other.peer_routes)
    heard = other.peer_routes["q1"]
    assert (heard.request.prompt_tokens, heard.request.block_hashes) == (500, (11, 22))
    assert (heard.chosen.replica_id, heard.router) == ("a", one.router_id)
    assert not one.state.peer_routes, "its own route did not come back to it"
    one.state.first_token("q1", 40.0)
    one.state.finished("q1")
    await eventually(lambda: "q1" not in other.peer_routes)
    assert one.published == 3
    assert two.applied == 3  # the empty batches that open each session carry no event
    assert one.dropped == two.dropped == one.malformed == 0


async def test_a_peers_new_session_drops_what_was_heard_from_it(
    shares: tuple[RouteShare, RouteShare, Redis],
) -> None:
    one, two, raw = shares
    _route(one.state, "q3")
    await eventually(lambda: "q3" in two.state.peer_routes)
    assert two.state.peer_routes["q3"].router == one.router_id
    # one reconnected (a later session): its done for q3 may have been lost on the way.
    later = RouteBatch(one.router_id, 99, (RouteEvent("routed", "q4", "a", 64),))
    await raw.publish(one._channel, encode_routes(later))
    await eventually(lambda: "q4" in two.state.peer_routes)
    assert "q3" not in two.state.peer_routes


async def test_foreign_messages_on_the_channel_are_ignored(
    shares: tuple[RouteShare, RouteShare, Redis],
) -> None:
    one, two, raw = shares
    await raw.publish(one._channel, b"not a route")
    _route(one.state, "q2")
    await eventually(lambda: "q2" in two.state.peer_routes)
    assert two.malformed == 1


async def test_an_unreachable_redis_blocks_nothing_and_counts_the_loss() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    state = _state(FakeClock())
    share = RouteShare(
        lambda: Redis.from_url(url, socket_connect_timeout=0.2),
        route_channel("x:", "m"),
        state,
        backoff=Backoff(initial_s=0.01, max_s=0.02),
    )
    task = asyncio.create_task(share.run())
    _route(state, "q1")  # returns at once: the event only goes to the buffer
    await eventually(lambda: share.dropped >= 1)
    assert not share.connected
    assert not task.done(), "Redis errors are retried, never raised"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
