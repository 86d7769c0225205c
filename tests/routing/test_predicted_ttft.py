"""The firstlight policy: who wins and why, herding guard, ties, calibration, explanation."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.routing import (
    Candidate,
    Decision,
    FirstlightParams,
    FirstlightPolicy,
    ReplicaView,
    RequestView,
    RoutingInput,
    TtftTerms,
)
from tests.conftest import FakeClock


class FixedCache:
    """A cache view with given answers (a fake of the CacheView protocol)."""

    def __init__(self, held: Mapping[str, int]) -> None:
        self.held = dict(held)

    def longest_prefix(self, block_hashes: Sequence[int]) -> Mapping[str, int]:
        return {r: min(n, len(block_hashes)) for r, n in self.held.items()}


class TieredCache(FixedCache):
    """A fake of the tiered cache view: device-tier answers, and host-tier blocks right
    after them."""

    def __init__(self, held: Mapping[str, int], host: Mapping[str, int]) -> None:
        super().__init__(held)
        self.host = dict(host)

    def host_prefix(
        self, block_hashes: Sequence[int], device: Mapping[str, int]
    ) -> Mapping[str, int]:
        return {r: min(n, len(block_hashes) - device.get(r, 0)) for r, n in self.host.items() if n}


PARAMS = FirstlightParams(
    prefill_tokens_per_s=1000,
    step_overhead_ms=5,
    decode_ms_per_running_seq=0,
    tie_margin_ms=2,
    # The TTFT terms alone; slot wait and the affinity penalty have their own tests.
    kv_full_fraction=1.0,
    affinity_weight=0.0,
)
REQUEST = RequestView("q1", prompt_tokens=640, block_hashes=tuple(range(20)), block_size=32)


def _policy(seed: int = 0, params: FirstlightParams = PARAMS) -> FirstlightPolicy:
    return FirstlightPolicy(params, rng=random.Random(seed), clock=lambda: 0.0)


def _replica(
    rid: str, queued: int = 0, region: str = "us-east", stats_at: float = 0.0
) -> ReplicaView:
    return ReplicaView(
        rid, region, queue_len=1 if queued else 0, pending_prefill_tokens=queued, stats_at=stats_at
    )


# (id, replicas, cached blocks, rtt by region, expected winner, expected reason)
CASES = [
    ("idle-beats-busy", [_replica("a", 2000), _replica("b", 0)], {}, {}, "b", "lowest-predicted-ttft"),
    ("cache-hit-beats-empty-cache", [_replica("a"), _replica("b")], {"a": 16}, {}, "a", "lowest-predicted-ttft"),
    # b holds 16 blocks (512 tokens) but has 600 tokens queued: 600+128 > 640 on a
    ("queue-outweighs-cache", [_replica("a", 0), _replica("b", 600)], {"b": 16}, {}, "a", "lowest-predicted-ttft"),
    ("cache-outweighs-small-queue", [_replica("a", 0), _replica("b", 100)], {"b": 16}, {}, "b", "lowest-predicted-ttft"),
    # the peer region's cache saves 512 ms of prefill but costs 217 ms of RTT: it wins
    ("remote-cache-beats-rtt", [_replica("a"), _replica("p", region="ap")], {"p": 16}, {"ap": 217.0}, "p", "lowest-predicted-ttft"),
    ("rtt-beats-small-cache", [_replica("a"), _replica("p", region="ap")], {"p": 2}, {"ap": 217.0}, "a", "lowest-predicted-ttft"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "cached", "rtt", "winner", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)  # fmt: skip
def test_who_wins_and_why(
    replicas: list[ReplicaView],
    cached: dict[str, int],
    rtt: dict[str, float],
    winner: str,
    reason: str,
) -> None:
    decision = _policy().choose(RoutingInput(REQUEST, replicas, FixedCache(cached), rtt))
    assert decision.winner.replica_id == winner
    assert decision.reason == reason
    assert [c.score for c in decision.ranked] == sorted(c.score for c in decision.ranked)
    assert decision.winner.terms is not None
    assert decision.winner.score == pytest.approx(decision.winner.terms.total_ms)


def test_reservation_moves_the_next_identical_request_elsewhere() -> None:
    policy = _policy()
    replicas = [_replica("a"), _replica("b", 100)]
    first = policy.choose(RoutingInput(REQUEST, replicas, FixedCache({})))
    assert first.winner.replica_id == "a"
    policy.on_routed(REQUEST, first.winner)
    second = policy.choose(RoutingInput(RequestView("q2", 640, REQUEST.block_hashes, 32), replicas))
    assert second.winner.replica_id == "b"
    policy.on_first_token(REQUEST, first.winner, observed_ttft_ms=first.winner.score)
    third = policy.choose(RoutingInput(RequestView("q3", 640, REQUEST.block_hashes, 32), replicas))
    assert third.winner.replica_id == "a"


@given(
    queued=st.lists(st.integers(0, 5000), min_size=2, max_size=8),
    cached_on_first=st.integers(0, 20),
)
def test_a_reservation_never_makes_its_replica_look_cheaper(
    queued: list[int], cached_on_first: int
) -> None:
    policy = _policy()
    replicas = [_replica(f"r{i}", q) for i, q in enumerate(queued)]
    cache = FixedCache({"r0": cached_on_first})
    before = {
        c.replica_id: c.score for c in policy.choose(RoutingInput(REQUEST, replicas, cache)).ranked
    }
    decision = policy.choose(RoutingInput(REQUEST, replicas, cache))
    policy.on_routed(REQUEST, decision.winner)
    after = policy.choose(
        RoutingInput(RequestView("q2", 640, REQUEST.block_hashes, 32), replicas, cache)
    )
    scores = {c.replica_id: c.score for c in after.ranked}
    picked = decision.winner.replica_id
    assert scores[picked] > before[picked]
    assert all(scores[r] == before[r] for r in scores if r != picked)


def test_near_ties_are_broken_at_random_and_reproducibly() -> None:
    replicas = [_replica(name) for name in "abcd"]
    winners = {
        _policy(seed).choose(RoutingInput(REQUEST, replicas)).winner.replica_id
        for seed in range(40)
    }
    assert winners == set("abcd")
    again = [_policy(7).choose(RoutingInput(REQUEST, replicas)).winner.replica_id for _ in range(3)]
    assert len(set(again)) == 1
    assert _policy().choose(RoutingInput(REQUEST, replicas)).reason == "near-tie"


def test_near_ties_go_to_the_shortest_queue() -> None:
    # Nothing queued for prefill anywhere: the predictions differ by the decode term
    # alone (0.05 ms per running sequence), well inside the 2 ms tie margin; the replica
    # with the fewest requests outstanding wins, whatever the random draw.
    params = PARAMS.model_copy(update={"decode_ms_per_running_seq": 0.05})
    replicas = [
        ReplicaView(name, "us-east", queue_len=n, running=n, pending_prefill_tokens=0)
        for name, n in (("a", 9), ("b", 3), ("c", 12), ("d", 7))
    ]
    for seed in range(20):
        decision = _policy(seed, params).choose(RoutingInput(REQUEST, replicas))
        assert decision.reason == "near-tie"
        assert [c.replica_id for c in decision.ranked] == ["b", "d", "a", "c"]


def test_behind_the_winner_equal_predictions_rank_the_shortest_queue_first() -> None:
    # "a" holds the prompt and wins outright; "c" and "b" are predicted the same TTFT
    # (nothing queued for prefill, no decode term), so the order Ray falls back in puts
    # the replica with fewer requests outstanding first, whatever order they came in.
    replicas = [
        _replica("a"),
        ReplicaView("c", "us-east", queue_len=6, running=6, pending_prefill_tokens=0),
        ReplicaView("b", "us-east", queue_len=2, running=2, pending_prefill_tokens=0),
    ]
    decision = _policy().choose(RoutingInput(REQUEST, replicas, FixedCache({"a": 16})))
    assert decision.reason == "lowest-predicted-ttft"
    assert decision.ranked[1].score == decision.ranked[2].score
    assert [c.replica_id for c in decision.ranked] == ["a", "b", "c"]


def test_calibration_shifts_traffic_away_from_a_slow_replica() -> None:
    policy = _policy()
    replicas = [_replica("a"), _replica("b", 300)]
    decision = policy.choose(RoutingInput(REQUEST, replicas))
    assert decision.winner.replica_id == "a"
    for _ in range(40):  # "a" turns out 3x slower than predicted (alpha 0.05: ~1 - 0.95^40)
        policy.on_routed(REQUEST, decision.winner)
        policy.on_first_token(REQUEST, decision.winner, 3 * decision.winner.score)
    assert policy.calibrator.correction("a") > 2.5
    assert policy.choose(RoutingInput(REQUEST, replicas)).winner.replica_id == "b"
    policy.on_replica_reset("a")  # its own measurements from now on: calibrate afresh
    assert policy.calibrator.correction("a") == 1.0
    assert policy.choose(RoutingInput(REQUEST, replicas)).winner.replica_id == "a"


def test_first_tokens_predicted_before_a_reset_do_not_calibrate_it_afresh() -> None:
    """A request routed with the prior rate, whose first token comes after the replica's
    first measurement reset its calibration, is not folded into the fresh calibration;
    one routed after the reset is."""
    clock = FakeClock(0.0)
    policy = FirstlightPolicy(PARAMS, rng=random.Random(0), clock=clock)
    replicas = [_replica("a")]
    before = policy.choose(RoutingInput(REQUEST, replicas)).winner
    policy.on_routed(REQUEST, before)
    clock.advance(0.1)
    policy.on_replica_reset("a")
    clock.advance(0.5)
    policy.on_first_token(REQUEST, before, 7 * before.score)  # predicted with the prior
    assert policy.calibrator.correction("a") == 1.0
    after = policy.choose(RoutingInput(REQUEST, replicas)).winner
    policy.on_routed(REQUEST, after)
    clock.advance(0.5)
    policy.on_first_token(REQUEST, after, 2 * after.score)
    assert policy.calibrator.correction("a") > 1.0


def test_failed_request_releases_its_reservation() -> None:
    policy = _policy()
    decision = policy.choose(RoutingInput(REQUEST, [_replica("a")]))
    policy.on_routed(REQUEST, decision.winner)
    assert len(policy.reservations) == 1
    policy.on_done(REQUEST, decision.winner)
    assert len(policy.reservations) == 0


def test_decision_explains_every_term() -> None:
    replicas = [_replica("a", 100), _replica("b", 1000)]
    decision: Decision = _policy().choose(RoutingInput(REQUEST, replicas, FixedCache({"a": 4})))
    text = decision.explain()
    assert text.startswith("firstlight: a (lowest-predicted-ttft) ttft=")
    assert "wait 100.0" in text
    assert "prefill 512.0 (512 uncached, 128 cached)" in text
    assert "runner-up b +" in text


def test_terms_without_host_tier_tokens_explain_no_reload() -> None:
    """Terms built without host-tier tokens (a policy or a peer gateway that does not
    know the host tier) have none: nothing reloaded, no reload in the explanation."""
    terms = TtftTerms(10.0, 20.0, 30.0, 5.0, cached_tokens=64, uncached_tokens=30)
    assert (terms.host_tokens, terms.reload_ms, terms.total_ms) == (0, 0.0, 65.0)
    decision = Decision(
        "firstlight", (Candidate("a", "us-east", 65.0, terms),), "lowest-predicted-ttft"
    )
    assert decision.explain() == (
        "firstlight: a (lowest-predicted-ttft) ttft=65.0ms = rtt 10.0 + wait 20.0"
        " + prefill 30.0 (30 uncached, 64 cached) + overhead 5.0"
    )


def test_a_reservation_is_held_for_the_documented_sixty_seconds() -> None:
    """docs/routing.md: a reservation whose first token never came is dropped after
    ``reservation_ttl_s``, 60 s by default. The replica's stats stay older than the
    routing, so until then its 640 reserved tokens are queued work (1 ms a token)."""
    assert "reservation_ttl_s" not in PARAMS.model_fields_set  # the default applies
    clock = FakeClock(1_000.0)
    policy = FirstlightPolicy(PARAMS, rng=random.Random(0), clock=clock)
    replicas = [_replica("a", stats_at=999.0)]
    first = policy.choose(RoutingInput(REQUEST, replicas))
    policy.on_routed(REQUEST, first.winner)  # its first token never comes

    def wait_ms() -> float:
        later = RequestView("q2", 640, REQUEST.block_hashes, 32)
        terms = policy.choose(RoutingInput(later, replicas)).winner.terms
        assert terms is not None
        return terms.wait_ms

    clock.now = 1_059.5
    assert wait_ms() == pytest.approx(640.0)
    clock.now = 1_060.0
    assert wait_ms() == pytest.approx(640.0)
    clock.now = 1_060.5
    assert wait_ms() == 0.0
    assert len(policy.reservations) == 0


@given(
    queued=st.lists(st.integers(0, 5000) | st.none(), min_size=1, max_size=8),
    cached=st.lists(st.integers(0, 30), min_size=8, max_size=8),
    host=st.lists(st.integers(0, 30), min_size=8, max_size=8),
    running=st.integers(0, 50),
    rate=st.none() | st.floats(100, 100_000),
    capacity=st.none() | st.integers(50, 1000),
    usage=st.floats(0, 1),
    stats_at=st.floats(-2.0, 0.5),
    signal=st.sampled_from(["router", "stats"]),
    sent=st.lists(st.tuples(st.integers(0, 7), st.integers(500, 3000)), min_size=4, max_size=20),
)
def test_fast_scores_equal_the_cost_model_terms(
    queued: list[int | None],
    cached: list[int],
    host: list[int],
    running: int,
    rate: float | None,
    capacity: int | None,
    usage: float,
    stats_at: float,
    signal: str,
    sent: list[tuple[int, int]],
) -> None:
    """The inlined scores equal ``predict_ttft``'s terms, the memory wait included (with
    and without a reported KV capacity, with stats of any age, from either memory signal,
    with requests already sent to the replicas)."""
    replicas = [
        ReplicaView(f"r{i}", "us-east", queue_len=running + 3, running=running,
                    pending_prefill_tokens=q, prefill_tokens_per_s=rate,
                    kv_cache_usage=usage, kv_cache_blocks=capacity, stats_at=stats_at)
        for i, q in enumerate(queued)
    ]  # fmt: skip
    cache = TieredCache(
        {f"r{i}": c for i, c in enumerate(cached)},
        {
            f"r{i}": min(h, max(20 - c, 0))
            for i, (c, h) in enumerate(zip(cached, host, strict=True))
        },
    )
    policy = _policy(
        params=PARAMS.model_copy(update={"memory_signal": signal, "reload_ms_per_token": 0.3})
    )
    for n, (replica, tokens) in enumerate(sent):
        earlier = RequestView(f"s{n}", tokens, tuple(range(n, n + tokens // 32)), 32)
        policy.on_routed(earlier, Candidate(f"r{replica}", "us-east", 0.0))
    decision = policy.choose(RoutingInput(REQUEST, replicas, cache, {"us-east": 3.0}))
    explained = [c for c in decision.ranked if c.terms is not None]
    assert len(explained) == min(len(replicas), 4)
    for candidate in explained:
        assert candidate.terms is not None
        assert candidate.score == pytest.approx(candidate.terms.total_ms)


def test_a_host_tier_hit_is_credited_at_the_reload_rate() -> None:
    # Two idle replicas; "h" holds 16 of the prompt's 20 blocks in host memory (512
    # tokens), "m" nothing. Reloading at 0.05 ms a token (25.6 ms) beats computing 512
    # tokens at 1 ms each.
    params = PARAMS.model_copy(update={"reload_ms_per_token": 0.05})
    replicas = [_replica("m"), _replica("h")]
    cache = TieredCache({}, {"h": 16})
    decision = _policy(params=params).choose(RoutingInput(REQUEST, replicas, cache))
    win = decision.winner
    assert win.replica_id == "h"
    assert win.terms is not None
    assert (win.terms.cached_tokens, win.terms.host_tokens, win.terms.uncached_tokens) == (
        0,
        512,
        128,
    )
    assert win.terms.reload_ms == pytest.approx(25.6)
    assert win.terms.total_ms == pytest.approx(128 + 25.6 + 5)
    assert "reload 25.6 (512 host-tier)" in decision.explain()
    # Unseen (today's router: the host tier is not read) it is a miss, a near-tie.
    blind = params.model_copy(update={"host_tier": False})
    decision = _policy(params=blind).choose(RoutingInput(REQUEST, replicas, cache))
    assert decision.reason == "near-tie"
    assert all(c.terms is not None and c.terms.host_tokens == 0 for c in decision.ranked)
    assert "reload" not in decision.explain()


def test_device_blocks_beat_the_same_blocks_in_host_memory() -> None:
    params = PARAMS.model_copy(update={"reload_ms_per_token": 0.05})
    replicas = [_replica("h"), _replica("d")]
    cache = TieredCache({"d": 16, "h": 4}, {"h": 12})
    decision = _policy(params=params).choose(RoutingInput(REQUEST, replicas, cache))
    assert decision.winner.replica_id == "d"
    host = next(c for c in decision.ranked if c.replica_id == "h")
    assert host.terms is not None
    assert (host.terms.cached_tokens, host.terms.host_tokens) == (128, 384)
    assert host.score - decision.winner.score == pytest.approx(384 * 0.05)


def test_a_reload_is_reserved_as_no_prefill_work() -> None:
    policy = _policy(params=PARAMS.model_copy(update={"reload_ms_per_token": 0.05}))
    replicas = [_replica("h")]
    decision = policy.choose(RoutingInput(REQUEST, replicas, TieredCache({}, {"h": 16})))
    policy.on_routed(REQUEST, decision.winner)
    assert policy.reservations.amount_after("h", -1.0) == 128


def test_affinity_penalty_keeps_a_request_with_its_prefix_holder() -> None:
    # "hot" holds 10 of 20 blocks but has 200 tokens queued: 200 + 320 + 5 = 525 ms;
    # "cold" is idle: 640 + 5 = 645 ms. Without the penalty "hot" wins already; make
    # "hot" busier (350 queued: 675 ms) and only the penalty (1 x 320 ms of prefill the
    # copy would cost) keeps the request there.
    cache = FixedCache({"hot": 10})
    replicas = (_replica("hot", queued=350), _replica("cold"))
    routing = RoutingInput(REQUEST, replicas, cache)
    plain = _policy().choose(routing)
    assert plain.winner.replica_id == "cold"
    sticky = _policy(params=PARAMS.model_copy(update={"affinity_weight": 1.0})).choose(routing)
    assert sticky.winner.replica_id == "hot"
    cold = next(c for c in sticky.ranked if c.replica_id == "cold")
    assert cold.score == pytest.approx(645.0 + 320.0)
    assert cold.terms is not None
    assert cold.terms.total_ms == pytest.approx(645.0)
    assert cold.predicted_ttft_ms == pytest.approx(645.0)


def test_the_affinity_penalty_grows_with_the_requests_a_pressed_replica_would_delay() -> None:
    # "hot" holds 10 of 20 blocks but has 1,000 tokens queued: 1000 + 320 + 5 = 1325 ms.
    # "cold" has no prefill queued: 640 + 5 = 645 ms, and the copy costs 320 ms of
    # prefill. On a pressed replica (more requests than it runs, or its KV memory at
    # kv_full_fraction) the copy holds up, or evicts the prefixes of, every request there:
    # the penalty is 320 x (1 + queue length) and the request stays with its prefix.
    # Under overload every such move would evict another prefix until the hit rate
    # collapses.
    cache = FixedCache({"hot": 10})
    sticky = _policy(
        params=PARAMS.model_copy(
            # memory as the replica's stats report it (the router's own record of what
            # it sent has its own test below)
            update={"affinity_weight": 1.0, "kv_full_fraction": 0.7, "memory_signal": "stats"}
        )
    )

    def cold_against_hot(cold: ReplicaView) -> tuple[str, float, float]:
        decision = sticky.choose(RoutingInput(REQUEST, (_replica("hot", queued=1000), cold), cache))
        ranked = next(c for c in decision.ranked if c.replica_id == "cold")
        return decision.winner.replica_id, ranked.predicted_ttft_ms, ranked.score

    def cold(queue_len: int, usage: float) -> ReplicaView:
        return ReplicaView(
            "cold",
            "us-east",
            queue_len=queue_len,
            running=3,
            pending_prefill_tokens=0,
            kv_cache_usage=usage,
            kv_cache_blocks=1000,
        )

    # Saturated: four requests, three running.
    assert cold_against_hot(cold(4, 0.2)) == (
        "hot",
        pytest.approx(645.0),
        pytest.approx(645.0 + 320.0 * 5),
    )
    # Three decoding, memory at 75 % of 1,000 blocks (kv_full_fraction 0.7).
    assert cold_against_hot(cold(3, 0.75)) == (
        "hot",
        pytest.approx(645.0),
        pytest.approx(645.0 + 320.0 * 4),
    )
    # Three decoding with memory to spare: the copy delays their steps once, as it does
    # this request's, and evicts nothing. One prefill: the request moves.
    assert cold_against_hot(cold(3, 0.5)) == (
        "cold",
        pytest.approx(645.0),
        pytest.approx(645.0 + 320.0),
    )
    # A replica that reports no capacity is pressed when its usage reaches kv_full.
    no_capacity = ReplicaView(
        "cold", "us-east", queue_len=3, running=3, pending_prefill_tokens=0, kv_cache_usage=0.7
    )
    winner, predicted, score = cold_against_hot(no_capacity)
    assert (winner, score) == ("hot", pytest.approx(predicted + 320.0 * 4))
    # An idle "cold" pays one prefill and takes the request.
    assert cold_against_hot(_replica("cold")) == (
        "cold",
        pytest.approx(645.0),
        pytest.approx(645.0 + 320.0),
    )


def test_hints_of_a_replica_that_is_gone_cost_nothing() -> None:
    # The mirror still holds 20 blocks of "gone" (a replica of an earlier deployment);
    # it is no candidate, so leaving it is no reason for a penalty: "a" (10 blocks) and
    # "b" are ranked by their TTFTs alone, and the winner's score is its TTFT.
    sticky = _policy(params=PARAMS.model_copy(update={"affinity_weight": 1.0}))
    replicas = (_replica("a"), _replica("b"))
    with_ghost = sticky.choose(RoutingInput(REQUEST, replicas, FixedCache({"a": 10, "gone": 20})))
    without = sticky.choose(RoutingInput(REQUEST, replicas, FixedCache({"a": 10})))
    assert [(c.replica_id, c.score) for c in with_ghost.ranked] == [
        (c.replica_id, c.score) for c in without.ranked
    ]
    assert with_ghost.winner.replica_id == "a"
    assert with_ghost.winner.score == pytest.approx(320.0 + 5.0)
    assert with_ghost.winner.predicted_ttft_ms == pytest.approx(with_ghost.winner.score)


def test_the_router_memory_signal_counts_what_it_sent_until_it_ends() -> None:
    """Stats say both replicas are empty; the router sent three 1,000-token prompts to
    "a": 3 x (32 blocks + 2 of half an output) = 102 of its 100 blocks are spoken for, so
    a request there would wait for memory (beyond the 3,000 ms of their reserved
    prefill) and goes to "b" — until those three end. The stats signal sees only the
    reserved prefill."""
    replicas = [ReplicaView(r, "us-east", queue_len=0, kv_cache_blocks=100) for r in "ab"]
    sent = [RequestView(f"s{n}", 1000, tuple(range(100 * n, 100 * n + 31)), 32) for n in range(3)]
    waits = {}
    for signal in ("router", "stats"):
        policy = _policy(params=PARAMS.model_copy(update={"memory_signal": signal}))
        for request in sent:
            policy.on_routed(request, Candidate("a", "us-east", 0.0))
        decision = policy.choose(RoutingInput(REQUEST, replicas))
        assert decision.winner.replica_id == "b"
        a = next(c for c in decision.ranked if c.replica_id == "a")
        assert a.terms is not None
        waits[signal] = a.terms.wait_ms
        for request in sent:
            policy.on_done(request, Candidate("a", "us-east", 0.0))
        after = policy.choose(RoutingInput(REQUEST, replicas)).ranked
        assert [c.terms.wait_ms if c.terms else None for c in after] == [0.0, 0.0]
    assert waits["stats"] == pytest.approx(3000.0)
    assert waits["router"] > waits["stats"] + 1.0
