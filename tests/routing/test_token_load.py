"""The token-load peers: llm-d's sticky-until-saturated and Dynamo's KV router, and the
in-flight count they share."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from firstlight.routing import Candidate, ReplicaView, RequestView, RoutingInput
from firstlight.routing.baselines import (
    DynamoKvParams,
    DynamoKvPolicy,
    LlmdStickyParams,
    LlmdStickyPolicy,
)
from firstlight.routing.inflight import InFlight

BLOCK = 16


class Cache:
    """A cache view with fixed matches."""

    def __init__(self, matches: Mapping[str, int]) -> None:
        self.matches = dict(matches)

    def longest_prefix(self, block_hashes: Sequence[int]) -> Mapping[str, int]:
        return {rid: min(n, len(block_hashes)) for rid, n in self.matches.items()}


def request(rid: str, blocks: int, extra_tokens: int = 0) -> RequestView:
    hashes = tuple(range(1000, 1000 + blocks))
    return RequestView(rid, blocks * BLOCK + extra_tokens, hashes, BLOCK)


def replicas(*names: str) -> list[ReplicaView]:
    return [ReplicaView(n, "us-east", 0) for n in names]


def routed(
    policy: LlmdStickyPolicy | DynamoKvPolicy, req: RequestView, rid: str, cached: int
) -> None:
    policy.on_routed(req, Candidate(rid, "us-east", 0.0, None, cached))


# --- the in-flight count ------------------------------------------------------------


def test_in_flight_releases_prefill_at_first_token_and_blocks_at_the_end() -> None:
    flight = InFlight()
    flight.add("a", "q1", 100, (1, 2, 3), 1)
    flight.add("a", "q2", 50, (1, 2, 9), 0)
    assert flight.prefill_tokens("a") == 150
    assert flight.active_blocks("a") == 4 + 1  # 1, 2, 3, 9 once each, plus q1's tail
    assert (flight.requests("a"), flight.requests("b")) == (2, 0)
    assert flight.new_blocks("a", (1, 2, 7), 1) == 2
    flight.prefill_done("q1")
    flight.prefill_done("q1")  # idempotent
    assert (flight.prefill_tokens("a"), flight.active_blocks("a")) == (50, 5)
    flight.done("q2")
    assert (flight.prefill_tokens("a"), flight.active_blocks("a")) == (0, 4)
    assert flight.requests("a") == 1
    flight.done("q1")
    flight.done("unknown")
    assert (flight.active_blocks("a"), flight.requests("a"), len(flight)) == (0, 0, 0)


# --- llm-d: sticky until saturated --------------------------------------------------


def llmd(**params: float) -> LlmdStickyPolicy:
    return LlmdStickyPolicy(LlmdStickyParams(**params), rng=random.Random(0), clock=lambda: 0.0)


def test_llmd_sticks_to_a_replica_matching_80_percent_even_when_it_is_busier() -> None:
    p = llmd()
    routed(p, request("old", 100), "a", 0)  # a has 1,600 tokens in flight
    decision = p.choose(RoutingInput(request("q", 10), replicas("a", "b"), Cache({"a": 8})))
    assert (decision.winner.replica_id, decision.reason) == ("a", "sticky")
    # 7 of 10 blocks is below the threshold: the least token load wins.
    decision = p.choose(RoutingInput(request("q", 10), replicas("a", "b"), Cache({"a": 7})))
    assert (decision.winner.replica_id, decision.reason) == ("b", "no-affinity")


def test_llmd_releases_stickiness_past_the_backlog_gap() -> None:
    # tau = 1000 tokens/s * 2 s = 2,000 tokens of gap between the sticky and the others.
    p = llmd(peak_prefill_tokens_per_s=1000.0, max_ttft_penalty_ms=2000.0)
    routed(p, request("old", 125), "a", 0)  # 2,000 uncached tokens in flight on a
    hot = RoutingInput(request("q", 10), replicas("a", "b"), Cache({"a": 10}))
    assert p.choose(hot).reason == "sticky"  # gap 2,000 is not above tau
    routed(p, request("old2", 1), "a", 0)  # 2,016
    decision = p.choose(hot)
    assert (decision.winner.replica_id, decision.reason) == ("b", "saturation-release")
    p.on_first_token(request("old", 125), Candidate("a", "us-east", 0.0), 5.0)
    assert p.choose(hot).reason == "sticky"  # the prefill ended: the backlog is gone


def test_llmd_load_counts_this_requests_uncached_tokens() -> None:
    p = llmd()
    routed(p, request("old", 3), "b", 0)  # b: 48 tokens in flight
    # a holds 5 of 10 blocks (not sticky): a's load 0 + 80, b's 48 + 160.
    decision = p.choose(RoutingInput(request("q", 10), replicas("a", "b"), Cache({"a": 5})))
    assert [c.replica_id for c in decision.ranked] == ["a", "b"]
    assert [c.score for c in decision.ranked] == [80.0, 208.0]


def test_llmd_equal_scores_rotate_round_robin() -> None:
    p = llmd()
    pick = [
        p.choose(RoutingInput(request(f"q{i}", 2), replicas("a", "b", "c"))).winner.replica_id
        for i in range(4)
    ]
    assert pick == ["a", "b", "c", "a"]


def test_llmd_ranks_filtered_out_replicas_last_with_increasing_scores() -> None:
    p = llmd()
    routed(p, request("old", 50), "a", 0)
    decision = p.choose(RoutingInput(request("q", 10), replicas("c", "b", "a"), Cache({"a": 10})))
    assert decision.winner.replica_id == "a"  # sticky, though the busiest
    scores = [c.score for c in decision.ranked]
    assert scores == sorted(scores)


# --- Dynamo: the KV router's default cost -------------------------------------------


def dynamo(**params: float) -> DynamoKvPolicy:
    return DynamoKvPolicy(DynamoKvParams(**params), rng=random.Random(0), clock=lambda: 0.0)


def test_dynamo_cost_is_prefill_blocks_net_of_overlap_plus_decode_blocks() -> None:
    p = dynamo()
    old = request("old", 4, extra_tokens=5)  # 69 tokens: 4 full blocks + a tail
    routed(p, old, "a", 0)
    q = request("q", 10)  # 160 tokens, blocks 1000..1009; old's are 1000..1003
    decision = p.choose(RoutingInput(q, replicas("a", "b"), Cache({"a": 4, "b": 2})))
    costs = {c.replica_id: c.score for c in decision.ranked}
    # a: prefill (69 + 160) / 16 - 4 = 10.3125; decode: 5 active + 6 new = 11.
    # b: prefill 160 / 16 - 2 = 8; decode 10 new.
    assert costs == pytest.approx({"a": 21.3125, "b": 18.0})
    assert decision.winner.replica_id == "b"
    # The first token ends old's prefill; its blocks stay until it ends.
    p.on_first_token(old, Candidate("a", "us-east", 0.0), 1.0)
    costs = {
        c.replica_id: c.score
        for c in p.choose(RoutingInput(q, replicas("a"), Cache({"a": 4}))).ranked
    }
    assert costs == pytest.approx({"a": 6.0 + 11.0})
    p.on_done(old, Candidate("a", "us-east", 0.0))
    costs = {
        c.replica_id: c.score
        for c in p.choose(RoutingInput(q, replicas("a"), Cache({"a": 4}))).ranked
    }
    assert costs == pytest.approx({"a": 6.0 + 10.0})


def test_dynamo_scales_and_credits_by_its_parameters() -> None:
    p = dynamo(overlap_score_credit=0.5, prefill_load_scale=2.0)
    q = request("q", 10)
    decision = p.choose(RoutingInput(q, replicas("a"), Cache({"a": 10})))
    assert decision.winner.score == pytest.approx(2.0 * (10 - 5) + 10)


def test_dynamo_breaks_exact_ties_at_random() -> None:
    p = dynamo()
    winners = {
        p.choose(RoutingInput(request(f"q{i}", 2), replicas("a", "b", "c"))).winner.replica_id
        for i in range(30)
    }
    assert winners == {"a", "b", "c"}
