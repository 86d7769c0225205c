"""Routes shared between a region's routers: the wire form, and two router states wired
to each other count each other's requests as their own until they end.

Real policies from the registry; the announcements go straight from one state to the
other (the Redis adapter is tested in tests/serve/test_route_share.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.region import (
    MalformedRoutesError,
    RouteBatch,
    RouteEvent,
    RouterState,
    RouteShareStatus,
    decode_routes,
    encode_routes,
)
from firstlight.region.state import PEER_ROUTE_TTL_S
from firstlight.routing import (
    FirstlightPolicy,
    ReplicaView,
    RequestView,
    RoutingInput,
    TtftTerms,
    build_policy,
)
from tests.conftest import FakeClock

REGION = "us-east"
PARAMS = {
    "prefill_tokens_per_s": 1000.0,
    "step_overhead_ms": 5.0,
    "decode_ms_per_running_seq": 0.0,
    "affinity_weight": 0.0,
    "kv_full_fraction": 1.0,
    "tie_margin_ms": 0.0,
}

events = st.builds(
    RouteEvent,
    stage=st.sampled_from(["routed", "first_token", "done"]),
    request_id=st.text(min_size=1, max_size=20),
    replica_id=st.text(max_size=20),
    prompt_tokens=st.integers(0, 10**6),
    block_size=st.integers(1, 256),
    block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=20).map(tuple),
    cached_blocks=st.integers(0, 10**4),
    observed_ttft_ms=st.floats(0, 1e6),
    terms=st.none()
    | st.builds(
        TtftTerms,
        rtt_ms=st.floats(0, 1e4),
        wait_ms=st.floats(0, 1e4),
        prefill_ms=st.floats(0, 1e4),
        overhead_ms=st.floats(0, 1e4),
        cached_tokens=st.integers(0, 10**6),
        uncached_tokens=st.integers(0, 10**6),
        correction=st.floats(0.01, 100),
        host_tokens=st.integers(0, 10**6),
        reload_ms=st.floats(0, 1e4),
    ),
)


@given(st.text(max_size=30), st.integers(0, 2**40), st.lists(events, max_size=10))
def test_routes_survive_the_wire(router_id: str, session: int, sent: list[RouteEvent]) -> None:
    batch = RouteBatch(router_id, session, tuple(sent))
    assert decode_routes(encode_routes(batch)) == batch


def test_the_later_stages_as_a_router_announces_them_survive_the_wire() -> None:
    """``first_token`` and ``done`` name the request only (the router state builds them
    with the defaults): their zero counts are valid on the wire."""
    later = (
        RouteEvent("first_token", "q1", observed_ttft_ms=250.0),
        RouteEvent("done", "q1"),
    )
    batch = RouteBatch("router-1", 3, later)
    assert decode_routes(encode_routes(batch)) == batch
    assert [(e.prompt_tokens, e.cached_blocks, e.block_hashes) for e in later] == [(0, 0, ())] * 2


@pytest.mark.parametrize(
    "message",
    [
        b"not json",
        b"{}",
        json.dumps({"router": "a", "events": []}).encode(),  # no session
        json.dumps({"router": "a", "session": -1, "events": []}).encode(),
        json.dumps({"session": 1, "router": 1, "events": []}).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[9, "q", "r", 1, 32, [], 0, 0.0, None]]}
        ).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[0, "", "r", 1, 32, [], 0, 0.0, None]]}
        ).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[0, "q", "r", 1, 32, [2**64], 0, 0.0, None]]}
        ).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[0, "q", "r", -1, 32, [], 0, 0.0, None]]}
        ).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[0, "q", "r", 1, 0, [], 0, 0.0, None]]}
        ).encode(),
        json.dumps({"session": 1, "router": "a", "events": [[0, "q", "r", 1, 32, []]]}).encode(),
        json.dumps(
            {"session": 1, "router": "a", "events": [[0, "q", "r", 1, 32, [], 0, 0.0, [1, 2]]]}
        ).encode(),
        json.dumps(
            {
                "session": 1,
                "router": "a",
                "events": [[0, "q", "r", 1, 32, [], 0, 0.0, [0, 0, 1, 1, 0, 1, 0]]],
            }
        ).encode(),
        json.dumps(
            {
                "session": 1,
                "router": "a",
                "events": [[0, "q", "r", 1, 32, [], 0, 0.0, [0, 0, 1, 1, 0, 1, 1, -5, 0]]],
            }
        ).encode(),
    ],
)
def test_malformed_messages_are_refused(message: bytes) -> None:
    with pytest.raises(MalformedRoutesError):
        decode_routes(message)


@pytest.mark.parametrize("stage", [3, 4, 9, 2**40])
def test_a_stage_past_the_last_is_refused_as_a_bad_stage(stage: int) -> None:
    """Stages are 0 (routed), 1 (first token) and 2 (done); any number past them is
    refused for what it is, not for whatever later breaks on it."""
    row = [stage, "q", "r", 1, 32, [], 0, 0.0, None]
    message = json.dumps({"session": 1, "router": "a", "events": [row]}).encode()
    with pytest.raises(MalformedRoutesError, match="bad stage"):
        decode_routes(message)
    row[0] = 2
    (event,) = decode_routes(json.dumps({"session": 1, "router": "a", "events": [row]})).events
    assert event.stage == "done"


def test_terms_from_a_gateway_without_host_tier_terms_are_read() -> None:
    # A rolling upgrade: an older gateway sends the 7 terms it knows.
    row: list[object] = [0, "q", "r", 64, 32, [], 0, 0.0, None]
    row[-1] = [1.0, 2.0, 30.0, 5.0, 32, 32, 1.5]
    old = {"session": 1, "router": "a", "events": [row]}
    (event,) = decode_routes(json.dumps(old).encode()).events
    assert event.terms == TtftTerms(1.0, 2.0, 30.0, 5.0, 32, 32, 1.5)
    assert (event.terms.host_tokens, event.terms.reload_ms) == (0, 0.0)


def test_a_route_share_status_is_a_fixed_snapshot_of_its_counts() -> None:
    # Made by the route share in this order and read field by field by the metrics.
    status = RouteShareStatus(True, 3, 2, 1)
    assert (status.connected, status.sent, status.heard, status.dropped) == (True, 3, 2, 1)
    with pytest.raises(FrozenInstanceError):
        status.sent = 4  # type: ignore[misc]


def _pair(clock: FakeClock) -> tuple[RouterState, RouterState]:
    """Two routers of one region, each announcing straight to the other."""
    states = []
    for seed in (1, 2):
        policy = build_policy("firstlight", PARAMS, rng=random.Random(seed), clock=clock)
        state = RouterState(REGION, "m", policy, clock=clock)
        state.set_replicas(
            {rid: ReplicaView(rid, REGION, queue_len=0, stats_at=0.0) for rid in ("a", "b")}
        )
        states.append(state)
    a, b = states
    a.route_sink = b.apply_peer_route
    b.route_sink = a.apply_peer_route
    return a, b


def _predicted(state: RouterState, replica_id: str) -> float:
    decision = state.policy.choose(
        RoutingInput(RequestView("probe", 100), tuple(state.replicas.values()), state.cache)
    )
    return next(c.score for c in decision.ranked if c.replica_id == replica_id)


def _route(state: RouterState, request: RequestView, replica_id: str) -> None:
    decision = state.policy.choose(
        RoutingInput(request, tuple(state.replicas.values()), state.cache)
    )
    state.record_decision(request, decision)
    state.record_routed(request.request_id, replica_id)


def test_a_peer_routers_prefill_counts_until_its_first_token() -> None:
    clock = FakeClock()
    one, two = _pair(clock)
    idle = _predicted(two, "a")
    _route(one, RequestView("q1", 2000, block_size=32), "a")
    # two never saw q1, yet now sees its 2000 uncached tokens queued on a (1 ms each)
    assert _predicted(two, "a") == pytest.approx(idle + 2000.0)
    assert _predicted(two, "b") == pytest.approx(idle)
    one.first_token("q1", 2005.0)  # as predicted: calibration stays 1
    assert _predicted(two, "a") == pytest.approx(idle)
    one.finished("q1")
    assert not two.peer_routes
    assert not one.peer_routes, "a router does not hear its own routes"


def test_without_a_share_each_router_counts_only_its_own() -> None:
    clock = FakeClock()
    one, two = _pair(clock)
    one.route_sink = None
    idle = _predicted(two, "a")
    _route(one, RequestView("q1", 2000, block_size=32), "a")
    assert _predicted(two, "a") == pytest.approx(idle)


def test_peer_routes_end_with_their_done_their_age_or_a_lost_feed() -> None:
    clock = FakeClock()
    one, two = _pair(clock)
    _route(one, RequestView("q1", 2000, block_size=32), "a")
    assert list(two.peer_routes) == ["q1"]
    # A done for a request never heard routed is ignored; so is a stray first token.
    two.apply_peer_route(RouteEvent("done", "unknown"))
    two.apply_peer_route(RouteEvent("first_token", "unknown"))
    assert list(two.peer_routes) == ["q1"]
    # The gateway that routed q1 died: its done never comes, and q1 ages out.
    clock.advance(PEER_ROUTE_TTL_S + 1)
    _route(one, RequestView("q2", 10, block_size=32), "b")
    assert list(two.peer_routes) == ["q2"]
    # The feed dropped messages: what was heard (from one router, or all) is forgotten.
    assert two.forget_peer_routes("another router") == 0
    assert two.forget_peer_routes() == 1
    assert not two.peer_routes
    assert _predicted(two, "b") == pytest.approx(_predicted(two, "a"))


def test_a_peers_first_token_calibrates_every_router() -> None:
    clock = FakeClock()
    one, two = _pair(clock)
    _route(one, RequestView("q1", 2000, block_size=32), "a")
    one.first_token("q1", 4 * 2005.0)  # four times slower than predicted
    for state in (one, two):
        assert isinstance(state.policy, FirstlightPolicy)
        assert state.policy.calibrator.correction("a") > 1.0
        assert state.policy.calibrator.correction("b") == 1.0
