"""The router state a model's request router shares with the gateway: routes, policy
hooks (reservations, calibration), estimates, replica count and hint blocks.

Real policies from the registry and a real hint mirror; no Ray is started.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import replace

import pytest

from firstlight.hints import BlockEvent, HintMirror
from firstlight.region.registry import router_state, routers
from firstlight.region.state import _MAX_ROUTES, RouterState
from firstlight.region.stats import with_shared_rates
from firstlight.routing import (
    NO_CACHE,
    Candidate,
    Decision,
    FirstlightPolicy,
    ReplicaView,
    RequestView,
    RoutingInput,
    RoutingPolicy,
    build_policy,
)
from tests.conftest import FakeClock

REGION = "us-east"
MODEL = "SmolLM2-135M-Instruct"
PARAMS = {
    "prefill_tokens_per_s": 1000.0,
    "step_overhead_ms": 5.0,
    "decode_ms_per_running_seq": 0.0,
    "affinity_weight": 0.0,  # scores are the predicted TTFTs, as these tests compute them
    "kv_full_fraction": 1.0,  # no slot wait: the queues here are prefill work
}


def _replica(rid: str, pending: int = 0) -> ReplicaView:
    return ReplicaView(
        rid, REGION, queue_len=1 if pending else 0, pending_prefill_tokens=pending, stats_at=0.0
    )


def _request(
    rid: str = "q1", prompt_tokens: int = 640, blocks: tuple[int, ...] = ()
) -> RequestView:
    return RequestView(rid, prompt_tokens, block_hashes=blocks, block_size=32)


def _firstlight(clock: FakeClock) -> FirstlightPolicy:
    policy = build_policy("firstlight", PARAMS, rng=random.Random(0), clock=clock)
    assert isinstance(policy, FirstlightPolicy)
    return policy


def _state(policy: RoutingPolicy, clock: FakeClock, **replicas: int) -> RouterState:
    state = RouterState(REGION, MODEL, policy, clock=clock)
    state.set_replicas({rid: _replica(rid, pending) for rid, pending in replicas.items()})
    return state


def _decide(state: RouterState, request: RequestView) -> Decision:
    """What the request router does: ask the policy, record the decision."""
    decision = state.policy.choose(
        RoutingInput(request, tuple(state.replicas.values()), state.cache)
    )
    state.record_decision(request, decision)
    return decision


def _score(decision: Decision, replica_id: str) -> float:
    return next(c.score for c in decision.ranked if c.replica_id == replica_id)


# --- replicas and estimates ------------------------------------------------------------


def test_no_replica_means_no_estimate() -> None:
    state = RouterState(REGION, MODEL, _firstlight(FakeClock()))
    assert state.healthy_replicas == 0
    assert state.estimate(_request()) is None
    assert state.hints_status() == "off"


def test_healthy_replicas_follow_the_replica_set() -> None:
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=0, b=0, c=0)
    assert state.healthy_replicas == 3
    state.set_replicas({"a": _replica("a")})
    assert state.healthy_replicas == 1
    state.set_replicas({})
    assert state.healthy_replicas == 0
    assert state.estimate(_request()) is None


def test_the_firstlight_policy_is_its_own_estimator() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=2000, b=0)
    assert state.estimator is policy
    estimate = state.estimate(_request())
    assert estimate is not None
    assert estimate.policy == "firstlight"
    assert estimate.winner.replica_id == "b"
    # idle b: 640 uncached tokens at 1 ms/token + 5 ms step
    assert estimate.winner.score == pytest.approx(645.0)
    assert _score(estimate, "a") == pytest.approx(2000 + 645.0)


def test_a_baseline_policy_gets_a_cost_model_estimator_and_is_not_consulted() -> None:
    clock = FakeClock()
    policy = build_policy("round_robin", {}, rng=random.Random(0), clock=clock)
    state = _state(policy, clock, a=2000, b=0)
    assert isinstance(state.estimator, FirstlightPolicy)
    assert state.estimator is not policy
    for _ in range(3):
        estimate = state.estimate(_request())
        assert estimate is not None
        assert estimate.policy == "estimate"
        assert estimate.winner.replica_id == "b", "by predicted TTFT, not in turn"
        assert estimate.winner.terms is not None
    # The round-robin counter did not move: its first decision still goes to "a".
    first = policy.choose(RoutingInput(_request(), tuple(state.replicas.values())))
    assert first.winner.replica_id == "a"


def test_estimates_reserve_nothing() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=100)
    first = state.estimate(_request("q1"))
    second = state.estimate(_request("q2"))
    assert first is not None
    assert second is not None
    assert len(policy.reservations) == 0
    assert [(c.replica_id, c.score) for c in first.ranked] == [
        (c.replica_id, c.score) for c in second.ranked
    ]


def test_estimates_use_the_hint_mirror() -> None:
    clock = FakeClock()
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    blocks = tuple(range(100, 120))  # 20 blocks of 32 = the whole 640-token prompt
    mirror.apply(BlockEvent("b", 0, stored=blocks, removed=()))
    state = RouterState(REGION, MODEL, _firstlight(clock), cache=mirror, clock=clock)
    state.set_replicas({"a": _replica("a"), "b": _replica("b")})

    estimate = state.estimate(_request(blocks=blocks))
    assert estimate is not None
    assert estimate.winner.replica_id == "b"
    assert estimate.winner.cached_blocks == 20
    assert estimate.winner.score == pytest.approx(1 + 5.0), "one token is always computed"
    assert _score(estimate, "a") == pytest.approx(645.0)


def test_hint_blocks_counts_the_mirror_entries() -> None:
    clock = FakeClock()
    assert RouterState(REGION, MODEL, _firstlight(clock), clock=clock).hint_blocks() == 0
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    state = RouterState(REGION, MODEL, _firstlight(clock), cache=mirror, clock=clock)
    assert state.hint_blocks() == 0
    mirror.apply(BlockEvent("a", 0, stored=(1, 2, 3), removed=()))
    mirror.apply(BlockEvent("b", 0, stored=(1,), removed=()))
    assert state.hint_blocks() == 4
    mirror.apply(BlockEvent("a", 0, stored=(), removed=(2,)))
    assert state.hint_blocks() == 3


def test_without_a_mirror_the_cache_is_no_cache() -> None:
    state = RouterState(REGION, MODEL, _firstlight(FakeClock()))
    assert state.cache is NO_CACHE


# --- routes and the policy's hooks -----------------------------------------------------


def test_a_routed_request_is_reserved_and_weighs_on_the_estimate() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    before = state.estimate(_request("probe"))
    assert before is not None

    request = _request("q1")
    decision = _decide(state, request)
    route = state.route_of("q1")
    assert route is not None
    assert route.decision is decision
    assert route.chosen is None, "decided, not yet sent"
    assert len(policy.reservations) == 0

    clock.advance(0.5)
    winner = decision.winner.replica_id
    state.record_routed("q1", winner)
    assert route.chosen == decision.winner
    assert route.routed_at == 1_000.5
    assert len(policy.reservations) == 1

    after = state.estimate(_request("probe"))
    assert after is not None
    # q1's 640 tokens now queue ahead on the chosen replica, at 1 ms/token
    assert _score(after, winner) == pytest.approx(_score(before, winner) + 640.0)
    assert after.winner.replica_id != winner


def test_routing_to_a_replica_the_decision_did_not_rank() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    _decide(state, _request("q1"))
    state.record_routed("q1", "c")
    route = state.route_of("q1")
    assert route is not None
    assert route.chosen == Candidate("c", REGION, float("inf"))
    assert policy.reservations.amount_after("c", 0.0) == 640


def test_a_request_routed_elsewhere_than_its_decisions_winner_is_a_fallback() -> None:
    """Ray sent it to another replica than the policy chose (ranked or not): counted,
    for the ``firstlight.route.fallbacks`` metric; a request sent to its winner is not."""
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=0, b=5000)
    winner = _decide(state, _request("q1")).winner.replica_id
    assert winner == "a"
    state.record_routed("q1", "a")
    assert state.fallbacks == 0
    assert _decide(state, _request("q2")).winner.replica_id == "a"
    state.record_routed("q2", "b")  # the runner-up
    assert _decide(state, _request("q3")).winner.replica_id == "a"
    state.record_routed("q3", "c")  # a replica the decision did not rank
    assert state.fallbacks == 2


def test_routing_an_unknown_request_is_ignored() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0)
    state.record_routed("never-decided", "a")
    assert state.route_of("never-decided") is None
    assert len(policy.reservations) == 0


def test_first_token_releases_the_reservation_and_calibrates() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    decision = _decide(state, _request("q1"))
    winner = decision.winner.replica_id
    state.record_routed("q1", winner)
    assert decision.winner.terms is not None
    predicted = decision.winner.terms.total_ms

    state.first_token("q1", observed_ttft_ms=3 * predicted)
    assert len(policy.reservations) == 0
    assert policy.calibrator.correction(winner) > 1.0, "slower than predicted"
    assert policy.calibrator.error_ms(winner) == pytest.approx(2 * predicted)
    assert state.route_of("q1") is not None, "kept until the request finishes"


def test_first_token_before_routing_changes_nothing() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    decision = _decide(state, _request("q1"))
    state.first_token("q1", 10_000.0)
    state.first_token("unknown", 10_000.0)
    for candidate in decision.ranked:
        assert policy.calibrator.error_ms(candidate.replica_id) is None
        assert policy.calibrator.correction(candidate.replica_id) == 1.0


def test_finished_releases_and_forgets_the_route() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    decision = _decide(state, _request("q1"))
    state.record_routed("q1", decision.winner.replica_id)
    assert len(policy.reservations) == 1

    state.finished("q1")
    assert state.route_of("q1") is None
    assert len(policy.reservations) == 0
    state.finished("q1")  # twice is harmless
    state.first_token("q1", 5.0)  # after the end: nothing to calibrate
    assert policy.calibrator.error_ms(decision.winner.replica_id) is None


def test_an_unrouted_request_finishes_without_touching_others() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    routed = _decide(state, _request("q1"))
    state.record_routed("q1", routed.winner.replica_id)
    _decide(state, _request("q2"))
    state.finished("q2")
    assert state.route_of("q2") is None
    assert len(policy.reservations) == 1, "q1 still holds its reservation"


def test_round_robin_routes_are_tracked_too() -> None:
    clock = FakeClock()
    policy = build_policy("round_robin", {}, rng=random.Random(0), clock=clock)
    state = _state(policy, clock, a=0, b=0)
    winners = []
    for i in range(4):
        decision = _decide(state, _request(f"q{i}"))
        state.record_routed(f"q{i}", decision.winner.replica_id)
        winners.append(decision.winner.replica_id)
    assert winners == ["a", "b", "a", "b"]
    route = state.route_of("q1")
    assert route is not None
    assert route.chosen is not None
    assert route.chosen.replica_id == "b"
    state.first_token("q1", 12.0)
    state.finished("q1")
    assert state.route_of("q1") is None
    assert len(state.routes) == 3


# --- bounded routes --------------------------------------------------------------------


def _simple_decision(replica_id: str = "a") -> Decision:
    return Decision("firstlight", (Candidate(replica_id, REGION, 1.0),), "test")


def test_routes_are_bounded_and_an_evicted_routed_request_is_released() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0)
    for rid in ("old-routed", "old-decided"):
        state.record_decision(_request(rid), _simple_decision())
    state.record_routed("old-routed", "a")
    assert len(policy.reservations) == 1

    for i in range(_MAX_ROUTES - 2):
        state.record_decision(_request(f"q{i}"), _simple_decision())
    assert len(state.routes) == _MAX_ROUTES
    assert state.route_of("old-routed") is not None

    state.record_decision(_request("one-more"), _simple_decision())
    assert len(state.routes) == _MAX_ROUTES
    assert state.route_of("old-routed") is None, "the oldest route was evicted"
    assert len(policy.reservations) == 0, "and its reservation released"
    assert state.route_of("old-decided") is not None

    state.record_decision(_request("another"), _simple_decision())
    assert state.route_of("old-decided") is None
    assert len(state.routes) == _MAX_ROUTES
    assert state.route_of("another") is not None


def test_a_redecided_request_becomes_the_newest_route() -> None:
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=0)
    state.record_decision(_request("first"), _simple_decision())
    state.record_decision(_request("second"), _simple_decision())
    for i in range(_MAX_ROUTES - 2):
        state.record_decision(_request(f"q{i}"), _simple_decision())
    retry = _simple_decision("b")
    state.record_decision(_request("first"), retry)  # a retry decides again
    state.record_decision(_request("one-more"), _simple_decision())
    assert state.route_of("second") is None, "now the oldest"
    route = state.route_of("first")
    assert route is not None
    assert route.decision is retry


# --- the per-process registry ----------------------------------------------------------


def test_router_states_are_found_by_app_and_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    state = RouterState(REGION, MODEL, _firstlight(FakeClock()))
    monkeypatch.setitem(routers(), ("app-test", "model-test"), state)
    assert router_state("app-test", "model-test") is state
    assert router_state("app-test", "other") is None


def test_dispatched_but_unrouted_work_weighs_on_the_estimate_until_routed() -> None:
    """A burst: the gateway sends several requests before Ray routes the first, so each
    must already count in the next one's estimate (spread over the replicas)."""
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=0, b=0)
    idle = state.estimate(_request("probe", 100))
    assert idle is not None
    state.dispatched("q1", 2000)
    busy = state.estimate(_request("probe", 100))
    assert busy is not None
    # 1000 tokens more on each replica at 1000 tokens/s: one second more to first token.
    assert busy.winner.score == pytest.approx(idle.winner.score + 1000.0)
    state.record_decision(_request("q1", 2000), _decide(state, _request("q1", 2000)))
    state.record_routed("q1", "a")
    assert "q1" not in state.unrouted
    state.dispatched("q2", 500)
    state.finished("q2")
    assert state.unrouted == {}


def test_prefill_finished_after_the_stats_snapshot_is_not_counted_as_pending() -> None:
    """Stats arrive late: the replica that just prefilled a prompt must not look busy
    with it until a newer snapshot comes."""
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=0, b=0)
    request = _request("q1", 640)
    decision = _decide(state, request)
    chosen = decision.winner.replica_id
    state.record_routed("q1", chosen)
    clock.advance(1.0)
    state.first_token("q1", 700.0)
    stale = {rid: _replica(rid, 640 if rid == chosen else 0) for rid in ("a", "b")}
    state.set_replicas(stale)  # snapshot from before the first token (stats_at = 0)
    assert state.replicas[chosen].pending_prefill_tokens == 0
    fresher = {rid: replace(_replica(rid, 100), stats_at=clock.now + 1) for rid in ("a", "b")}
    state.set_replicas(fresher)  # newer than the prefill: taken as reported
    assert state.replicas[chosen].pending_prefill_tokens == 100
    assert state.prefilled[chosen] == []


def test_replicas_that_have_not_measured_take_the_mean_of_those_that_have() -> None:
    views = {
        "a": ReplicaView("a", "here", 0, prefill_tokens_per_s=800.0, step_ms=40.0),
        "b": ReplicaView("b", "here", 0, prefill_tokens_per_s=1000.0, step_ms=None),
        "c": ReplicaView("c", "here", 0),
    }
    shared = with_shared_rates(views)
    assert shared["a"] == views["a"]
    assert (shared["b"].prefill_tokens_per_s, shared["b"].step_ms) == (1000.0, 40.0)
    assert (shared["c"].prefill_tokens_per_s, shared["c"].step_ms) == (900.0, 40.0)


def test_a_step_time_is_shared_when_every_replica_has_measured_its_rate_but_not_its_step() -> None:
    """The two measurements are shared each on its own: all rates known does not leave
    a replica without a step time at the policy's prior."""
    views = {
        "a": ReplicaView("a", "here", 0, prefill_tokens_per_s=800.0, step_ms=40.0),
        "b": ReplicaView("b", "here", 0, prefill_tokens_per_s=1000.0, step_ms=None),
    }
    shared = with_shared_rates(views)
    assert shared["a"] == views["a"]
    assert (shared["b"].prefill_tokens_per_s, shared["b"].step_ms) == (1000.0, 40.0)
    swapped = {
        "a": ReplicaView("a", "here", 0, prefill_tokens_per_s=800.0, step_ms=40.0),
        "b": ReplicaView("b", "here", 0, prefill_tokens_per_s=None, step_ms=20.0),
    }
    assert with_shared_rates(swapped)["b"].prefill_tokens_per_s == 800.0


def test_nothing_to_share_when_all_or_none_have_measured() -> None:
    none = {"a": ReplicaView("a", "here", 0), "b": ReplicaView("b", "here", 0)}
    assert with_shared_rates(none) == none
    both = {
        "a": ReplicaView("a", "here", 0, prefill_tokens_per_s=1.0, step_ms=2.0),
        "b": ReplicaView("b", "here", 0, prefill_tokens_per_s=3.0, step_ms=4.0),
    }
    assert with_shared_rates(both) == both


def test_the_summary_publishes_the_best_replicas_wait_and_the_mean_over_all() -> None:
    # Queued prefill 0, 100 and 500 tokens at 1 ms per token, 5 ms step overhead.
    state = _state(_firstlight(FakeClock()), FakeClock(), a=0, b=100, c=500)
    summary = state.summary(frozenset({7}))
    assert summary.healthy_replicas == 3
    assert summary.predicted_wait_ms == pytest.approx(5.0)
    assert summary.mean_wait_ms == pytest.approx(5.0 + (0 + 100 + 500) / 3)
    assert summary.prefill_ms_per_token == pytest.approx(1.0)
    assert summary.hot_blocks == frozenset({7})
    assert (summary.kv_used_blocks, summary.kv_total_blocks) == (None, None)  # not reported
    assert summary.mean_queue_len == pytest.approx(2 / 3)  # b and c have one each


def test_the_summary_publishes_the_kv_cache_held_over_its_capacity() -> None:
    clock = FakeClock()
    state = _state(_firstlight(clock), clock)
    state.set_replicas(
        {
            "a": dataclasses.replace(_replica("a"), kv_cache_usage=0.5, kv_cache_blocks=1000),
            "b": dataclasses.replace(_replica("b"), kv_cache_usage=0.25, kv_cache_blocks=2000),
        }
    )
    summary = state.summary()
    assert (summary.kv_used_blocks, summary.kv_total_blocks) == (1000, 3000)
    assert summary.mean_queue_len == 0.0


def test_a_replica_added_by_autoscaling_takes_its_share_of_a_burst_not_all_of_it() -> None:
    # Serve adds a replica while one is busy: the router must not send the whole burst
    # to the newcomer (it looks idle until its own stats arrive); each pick reserves its
    # prefill, so the predicted waits meet and the burst splits.
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, old=3200)
    state.set_replicas({"old": _replica("old", 3200), "new": _replica("new")})
    picks = []
    for index in range(12):
        request = _request(f"b{index}", prompt_tokens=640)
        decision = _decide(state, request)
        state.record_routed(request.request_id, decision.winner.replica_id)
        picks.append(decision.winner.replica_id)
    # 3,200 queued tokens are five requests' worth: the newcomer takes the first five
    # or so, then they alternate.
    assert picks[:4] == ["new"] * 4
    assert 7 <= picks.count("new") <= 10
    assert "old" in picks[5:]


def test_a_replica_removed_by_autoscaling_loses_its_hints_calibration_and_routes() -> None:
    clock = FakeClock()
    policy = _firstlight(clock)
    state = _state(policy, clock, a=0, b=0)
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    state.cache = mirror
    assert state.replica_set(["a", "b"]) == {}
    mirror.apply(BlockEvent("b", 1, stored=(1, 2, 3), removed=()))
    mirror.apply(BlockEvent("a", 1, stored=(9,), removed=()))
    before = _decide(state, _request("q0", blocks=(1, 2, 3)))
    assert before.winner.replica_id == "b"
    assert before.winner.cached_blocks == 3
    assert before.winner.terms is not None
    policy.calibrator.observe("b", before.winner.terms, before.winner.terms.total_ms * 3)
    assert policy.calibrator.correction("b") > 1.0
    # What the request router's update_replicas does when Ray's set no longer has b.
    assert state.replica_set(["a"]) == {"b": 3}
    assert mirror.longest_prefix((1, 2, 3)) == {}
    assert mirror.longest_prefix((9,)) == {"a": 1}
    assert policy.calibrator.correction("b") == 1.0
    assert state.replica_set(["a"]) == {}  # told twice: nothing left to drop
    state.set_replicas({"a": _replica("a")})
    decision = _decide(state, _request(blocks=(1, 2, 3)))
    assert [c.replica_id for c in decision.ranked] == ["a"]
    assert decision.winner.cached_blocks == 0


def test_the_summary_offers_peers_only_hot_blocks_a_replica_still_caches() -> None:
    clock = FakeClock()
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    state = RouterState(REGION, MODEL, _firstlight(clock), cache=mirror, clock=clock)
    state.set_replicas({"a": _replica("a")})
    mirror.apply(BlockEvent("a", 0, stored=(7, 8), removed=()))
    mirror.apply(BlockEvent("a", 0, stored=(), removed=(8,)))  # evicted since it was served
    assert state.summary(frozenset({7, 8, 9})).hot_blocks == frozenset({7})


# --- the ticket: one decision per request ----------------------------------------------


class _Counting:
    """Wraps a policy and counts its ``choose`` calls (the Protocol's other hooks pass)."""

    def __init__(self, inner: RoutingPolicy) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def choose(self, data: RoutingInput) -> Decision:
        self.calls += 1
        return self.inner.choose(data)


def test_a_committed_ticket_is_the_estimate_the_region_decision_read() -> None:
    clock = FakeClock()
    policy = _Counting(_firstlight(clock))
    state = _state(policy, clock, a=0, b=6400)  # type: ignore[arg-type]
    assert state.estimator is policy  # the cost model is the policy
    ticket = state.admit(_request("q1"))
    assert ticket.estimate is not None
    assert ticket.estimate.winner.replica_id == "a"
    assert ticket.predicted_ttft_ms == ticket.estimate.winner.predicted_ttft_ms
    committed = ticket.commit(640)
    assert committed is ticket.estimate  # not ranked again
    assert policy.calls == 1
    route = state.route_of("q1")
    assert route is not None
    assert route.decision is committed
    assert route.chosen is None
    assert route.decision_s == ticket.estimate_s
    assert state.unrouted == {"q1": 640}  # queued work until it is routed
    ticket.routed("a")
    assert state.unrouted == {}
    assert route.chosen is not None
    ticket.finished()
    assert state.route_of("q1") is None


def test_a_baseline_policy_commits_its_own_choice_once() -> None:
    clock = FakeClock()
    policy = _Counting(build_policy("least_queue", {}, rng=random.Random(0), clock=clock))
    state = _state(policy, clock, a=6400, b=0)  # type: ignore[arg-type]
    ticket = state.admit(_request("q1"))
    assert policy.calls == 0  # the estimate is the cost model's, not the baseline's
    committed = ticket.commit(640)
    assert policy.calls == 1
    assert committed is not None
    route = state.route_of("q1")
    assert route is not None
    assert route.decision is committed


def test_a_ticket_without_replicas_estimates_and_commits_nothing() -> None:
    state = RouterState(REGION, MODEL, _firstlight(FakeClock()))
    ticket = state.admit(_request("q1"))
    assert ticket.estimate is None
    assert ticket.predicted_ttft_ms is None
    assert ticket.commit(640) is None
    assert state.route_of("q1") is None


# --- edges a mutation run found untested (docs/development.md, mutation testing) -------


def test_unrouted_work_adds_to_what_a_replica_already_has_queued() -> None:
    clock = FakeClock()
    state = _state(_firstlight(clock), clock, a=640, b=640)
    before = state.estimate(_request("probe", 100))
    state.dispatched("q1", 2000)  # 1000 tokens more on each of the two replicas
    after = state.estimate(_request("probe", 100))
    assert before is not None
    assert after is not None
    assert after.winner.terms is not None
    assert after.winner.score == pytest.approx(before.winner.score + 1000.0)


def test_a_fully_cached_prompt_still_counts_one_token_of_prefill() -> None:
    clock = FakeClock()
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    mirror.apply(BlockEvent("a", 0, stored=(1, 2), removed=()))
    state = RouterState(REGION, MODEL, _firstlight(clock), cache=mirror, clock=clock)
    state.set_replicas({"a": _replica("a")})
    request = _request("q1", 64, blocks=(1, 2))  # both 32-token blocks cached on a
    assert _decide(state, request).winner.cached_blocks == 2
    state.record_routed("q1", "a")
    state.first_token("q1", 10.0)
    assert [tokens for _, tokens in state.prefilled["a"]] == [1]


def test_a_summary_without_replicas_predicts_nothing() -> None:
    clock = FakeClock()
    state = RouterState(REGION, MODEL, _firstlight(clock), clock=clock)
    summary = state.summary()
    assert (summary.healthy_replicas, summary.predicted_wait_ms) == (0, 0.0)
    assert summary.prefill_ms_per_token == 0.0


def test_a_committed_ticket_queues_only_the_prefill_its_estimate_does_not_find_cached() -> None:
    clock = FakeClock()
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    mirror.apply(BlockEvent("a", 0, stored=(1, 2), removed=()))
    state = RouterState(REGION, MODEL, _firstlight(clock), cache=mirror, clock=clock)
    state.set_replicas({"a": _replica("a")})
    ticket = state.admit(_request("q1", 100, blocks=(1, 2, 3)))  # 64 of 100 tokens cached
    ticket.commit()
    assert state.unrouted == {"q1": 100 - 64}
