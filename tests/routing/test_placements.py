"""The router's record of where it sent each prefix, and the policy reading it."""

from __future__ import annotations

import random

import pytest

from firstlight.routing import (
    Candidate,
    FirstlightParams,
    FirstlightPolicy,
    ReplicaView,
    RequestView,
    RoutingInput,
)
from firstlight.routing.placements import Placements


def test_the_deepest_shared_checkpoint_names_where_a_prefix_went() -> None:
    places = Placements(max_entries=100)
    places.record(tuple(range(40)), "a")  # checkpoints 4, 8, 16, 32
    places.record((*range(10), 99, 98, 97, 96, 95, 94, 93), "b")  # shares 4 and 8 with it
    # A prompt sharing a's first 35 blocks: "b" was sent the 4- and 8-block prefixes
    # last; only "a" had the 16- and 32-block ones.
    assert places.held(tuple(range(35))) == {"a": 32, "b": 8}
    assert places.held((5, 6, 7)) == {}  # shorter than any checkpoint
    assert places.held(tuple(range(100, 140))) == {}


def test_the_record_is_bounded_and_can_be_off() -> None:
    places = Placements(max_entries=3)
    places.record(tuple(range(40)), "a")  # 4 checkpoints: the oldest (depth 4) goes
    assert len(places) == 3
    assert places.held(tuple(range(40))) == {"a": 32}
    off = Placements(max_entries=0)
    off.record(tuple(range(40)), "a")
    assert (len(off), off.held(tuple(range(40)))) == (0, {})
    with pytest.raises(ValueError, match="max_entries"):
        Placements(max_entries=-1)


@pytest.mark.parametrize(("memory", "winner"), [(1000, "a"), (0, "b")])
def test_an_evicted_prefix_pulls_its_next_request_back_where_it_went(
    memory: int, winner: str
) -> None:
    """The mirror holds nothing (the engine evicted the 20-block prompt "a" served); "a"
    has 100 prefill tokens queued, "b" none. Leaving "a" would copy the prefix: the
    penalty (2 x 640 tokens of prefill) outweighs the 100 ms of queue, unless the router
    keeps no record."""
    params = FirstlightParams(
        prefill_tokens_per_s=1000, step_overhead_ms=5, decode_ms_per_running_seq=0,
        kv_full_fraction=1.0, affinity_weight=2.0, placement_memory=memory,
    )  # fmt: skip
    policy = FirstlightPolicy(params, rng=random.Random(0), clock=lambda: 0.0)
    earlier = RequestView("q0", 640, tuple(range(20)), 32)
    policy.on_routed(earlier, Candidate("a", "us-east", 0.0))
    policy.on_done(earlier, Candidate("a", "us-east", 0.0))
    replicas = [
        ReplicaView("a", "us-east", queue_len=1, pending_prefill_tokens=100),
        ReplicaView("b", "us-east", queue_len=0, pending_prefill_tokens=0),
    ]
    decision = policy.choose(RoutingInput(RequestView("q1", 700, tuple(range(21)), 32), replicas))
    assert decision.winner.replica_id == winner
    # Predictions stay honest: nothing is cached anywhere, whatever the ranking.
    assert all(c.cached_blocks == 0 for c in decision.ranked)
