"""The region decision, rule by rule (the gateway and the simulator both run it)."""

from __future__ import annotations

import pytest

from firstlight.config import RouterConfig
from firstlight.region import PeerChoice, PeerOption, decide_region, rank_peers
from firstlight.regions.summary import ModelSummary
from firstlight.routing import Candidate, Decision, RequestView
from firstlight.routing.decision import TtftTerms


def _local(wait_ms: float, prefill_ms: float = 100.0, uncached: int = 100) -> Decision:
    terms = TtftTerms(0.0, wait_ms, prefill_ms, 5.0, cached_tokens=0, uncached_tokens=uncached)
    return Decision("firstlight", (Candidate("r1", "here", terms.total_ms, terms),), "test")


FAST = PeerChoice("fast", 60.0)
SLOW = PeerChoice("slow", 500.0)
PEERS = (FAST, SLOW)
DEFAULT = RouterConfig(spill_over_margin_ms=50.0)
BOUNDED = RouterConfig(spill_over_margin_ms=50.0, admission_wait_ms=200.0)

CASES = [
    # (name, local estimate, healthy, from_peer, router, route, peers, fallback, refusal)
    ("served here", _local(0.0), True, False, DEFAULT, "local", (), "refuse", None),
    ("a peer beats here by more than the margin", _local(300.0), True, False, DEFAULT, "spill_over", PEERS, "local", None),
    ("a peer beats here by less than the margin", _local(0.0, prefill_ms=95.0), True, False, RouterConfig(spill_over_margin_ms=60.0), "local", (), "refuse", None),
    ("no healthy replica", _local(0.0), False, False, DEFAULT, "fail_over", PEERS, "refuse", "no_replica"),
    ("overloaded: only peers faster than here", _local(300.0), True, False, BOUNDED, "overflow", (FAST,), "refuse", "overloaded"),
    ("overloaded and every peer slower", _local(30.0, prefill_ms=10.0), True, False, RouterConfig(admission_wait_ms=20.0), "overflow", (), "refuse", "overloaded"),
    ("forwarded here: served", _local(300.0), True, True, DEFAULT, "from_peer", (), "refuse", None),
    ("forwarded here, no replica", _local(0.0), False, True, DEFAULT, "refuse", (), "refuse", "no_replica"),
    ("forwarded here, overloaded", _local(300.0), True, True, BOUNDED, "refuse", (), "refuse", "overloaded"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("local", "healthy", "from_peer", "router", "route", "peers", "fallback", "refusal"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_rules(
    local: Decision,
    healthy: bool,
    from_peer: bool,
    router: RouterConfig,
    route: str,
    peers: tuple[PeerChoice, ...],
    fallback: str,
    refusal: str | None,
) -> None:
    decision = decide_region(
        local, healthy=healthy, from_peer=from_peer, peers=PEERS, router=router
    )
    assert (decision.route, decision.peers, decision.fallback, decision.refusal) == (
        route,
        peers,
        fallback,
        refusal,
    )
    assert decision.local is local


def test_an_overload_refusal_carries_the_wait_for_retry_after() -> None:
    decision = decide_region(_local(900.0), healthy=True, from_peer=False, peers=(), router=BOUNDED)
    assert (decision.route, decision.peers, decision.wait_ms) == ("overflow", (), 900.0)


def test_no_peer_and_no_local_estimate_stay_here() -> None:
    decision = decide_region(None, healthy=True, from_peer=False, peers=(), router=DEFAULT)
    assert decision.route == "local"


def _summary(wait_ms: float, ms_per_token: float, *, measured: bool = True) -> ModelSummary:
    return ModelSummary(2, wait_ms, ms_per_token, frozenset({11, 12}), measured)


def test_peers_are_ranked_by_predicted_ttft_with_round_trip_backlog_and_hot_prefix() -> None:
    request = RequestView("q", 100, (11, 12, 13), block_size=32)
    peers = [
        PeerOption("far", _summary(10.0, 1.0), rtt_ms=200.0),
        PeerOption("near-busy", _summary(10.0, 1.0), rtt_ms=20.0, forwarded_tokens=400),
        PeerOption("near", _summary(10.0, 1.0), rtt_ms=20.0),
    ]
    ranked = rank_peers(request, peers, _local(0.0))
    # near: 20 + 10 + (100 - 64 cached) x 1; near-busy adds 400 tokens over 2 replicas.
    # Each lacks the prompt's third full block: 32 tokens x 1 ms to copy (ranking only).
    assert ranked == (
        PeerChoice("near", 66.0, 10.0, 36.0, copy_penalty_ms=32.0, cached_tokens=64),
        PeerChoice("far", 246.0, 10.0, 36.0, copy_penalty_ms=32.0, cached_tokens=64),
        PeerChoice("near-busy", 266.0, 210.0, 36.0, copy_penalty_ms=32.0, cached_tokens=64),
    )


def test_a_peer_publishing_its_mean_wait_is_priced_at_it() -> None:
    request = RequestView("q", 100, (), block_size=32)
    summary = ModelSummary(4, 10.0, 1.0, measured=True, mean_wait_ms=70.0)
    (choice,) = rank_peers(request, [PeerOption("p", summary, rtt_ms=20.0)], _local(0.0))
    assert (choice.wait_ms, choice.predicted_ttft_ms) == (70.0, 20.0 + 70.0 + 100.0)


@pytest.mark.parametrize(
    ("wait_ms", "route"),
    [(30.0, "spill_over"), (60.0, "spill_over"), (61.0, "local")],
)
def test_spill_over_skips_a_peer_whose_queue_holds_more_than_the_request(
    wait_ms: float, route: str
) -> None:
    """Rule 4: a peer is saturated when its wait exceeds the request's own service
    there times ``spill_max_peer_wait_ratio`` (1 by default)."""
    peer = PeerChoice("p", 20.0 + wait_ms + 60.0, wait_ms=wait_ms, service_ms=60.0)
    decision = decide_region(
        _local(900.0), healthy=True, from_peer=False, peers=(peer,), router=DEFAULT
    )
    assert decision.route == route
    assert decision.peers == ((peer,) if route == "spill_over" else ())


@pytest.mark.parametrize(
    ("wait_ms", "route"),
    [(31.0, "spill_over"), (60.0, "spill_over"), (65.0, "spill_over"), (66.0, "local")],
)
def test_the_step_that_emits_the_first_token_is_the_requests_own_time_not_queue(
    wait_ms: float, route: str
) -> None:
    """A peer holding the prompt's prefix has 5 ms of prefill left; its 30 ms engine step
    is part of its wait. Queue = wait - step; saturated past 1 x (5 + 30) of queue, so up
    to a 65 ms wait it takes the request (counted as queue, the step alone made every
    such peer look saturated, however idle)."""
    peer = PeerChoice("p", 20.0 + wait_ms + 5.0, wait_ms=wait_ms, service_ms=5.0, step_ms=30.0)
    decision = decide_region(
        _local(900.0), healthy=True, from_peer=False, peers=(peer,), router=DEFAULT
    )
    assert decision.route == route


def test_a_summary_that_names_its_step_puts_it_in_the_peer_choice() -> None:
    request = RequestView("q", 100, (11, 12, 13), block_size=32)
    summary = ModelSummary(2, 40.0, 1.0, frozenset({11, 12}), True, step_ms=30.0)
    (choice,) = rank_peers(request, [PeerOption("p", summary, rtt_ms=20.0)], None)
    assert (choice.wait_ms, choice.step_ms, choice.service_ms) == (40.0, 30.0, 36.0)
    assert not choice.saturated(1.0)  # 10 ms of queue against 66 ms of its own
    older = ModelSummary(2, 40.0, 1.0, frozenset({11, 12}), True)
    (legacy,) = rank_peers(request, [PeerOption("p", older, rtt_ms=20.0)], None)
    assert legacy.step_ms == 0.0  # an older peer: its whole wait counts as queue


def test_a_peer_choice_naming_no_service_of_its_own_is_saturated_by_any_queue() -> None:
    """Without a ``service_ms`` the request brings no work of its own there, so even a
    half-millisecond queue holds more than it (``wait > ratio x service``): no spill."""
    idle = PeerChoice("p", 60.0)
    queued = PeerChoice("p", 60.5, wait_ms=0.5)
    assert (idle.service_ms, idle.saturated(1.0), queued.saturated(1.0)) == (0.0, False, True)
    # Naming no wait, it predicts none (nor a step): its whole prediction is round trip
    # and service.
    assert (idle.wait_ms, idle.step_ms) == (0.0, 0.0)
    decision = decide_region(
        _local(900.0), healthy=True, from_peer=False, peers=(queued,), router=DEFAULT
    )
    assert (decision.route, decision.peers) == ("local", ())


@pytest.mark.parametrize(
    ("kv_usage", "route"), [(None, "spill_over"), (0.8, "spill_over"), (0.81, "local")]
)
def test_spill_over_skips_a_peer_whose_cache_the_request_would_fill(
    kv_usage: float | None, route: str
) -> None:
    """Rule 4: an idle queue is not enough; past ``spill_max_peer_kv_usage`` (0.8) of its
    KV cache, the peer's own users would wait for room. A peer that does not report its
    cache is judged by its queue alone."""
    peer = PeerChoice("p", 100.0, wait_ms=20.0, service_ms=60.0, kv_usage=kv_usage)
    decision = decide_region(
        _local(900.0), healthy=True, from_peer=False, peers=(peer,), router=DEFAULT
    )
    assert decision.route == route
    full = PeerChoice("p", 100.0, wait_ms=20.0, service_ms=60.0, kv_usage=0.95)
    fail_over = decide_region(
        _local(0.0), healthy=False, from_peer=False, peers=(full,), router=DEFAULT
    )
    assert fail_over.peers == (full,)  # fail-over forwards what would be refused


def test_with_spill_over_off_requests_stay_home_but_still_fail_over() -> None:
    off = RouterConfig(spill_over=False)
    spilling = decide_region(_local(300.0), healthy=True, from_peer=False, peers=PEERS, router=off)
    assert (spilling.route, spilling.peers) == ("local", ())
    down = decide_region(_local(0.0), healthy=False, from_peer=False, peers=PEERS, router=off)
    assert (down.route, down.peers) == ("fail_over", PEERS)
    bounded = RouterConfig(spill_over=False, admission_wait_ms=200.0)
    over = decide_region(_local(300.0), healthy=True, from_peer=False, peers=PEERS, router=bounded)
    assert (over.route, over.peers) == ("overflow", (FAST,))


def test_a_saturated_peer_still_takes_overflow() -> None:
    peer = PeerChoice("p", 500.0, wait_ms=400.0, service_ms=60.0)
    decision = decide_region(
        _local(900.0), healthy=True, from_peer=False, peers=(peer,), router=BOUNDED
    )
    assert (decision.route, decision.peers) == ("overflow", (peer,))


def test_an_unmeasured_peer_is_priced_at_the_local_rate() -> None:
    request = RequestView("q", 101, (), block_size=32)
    peer = PeerOption("p", _summary(10.0, 0.5, measured=False), rtt_ms=0.0)
    (choice,) = rank_peers(request, [peer], _local(0.0, prefill_ms=200.0, uncached=100))
    assert choice.predicted_ttft_ms == pytest.approx(10.0 * 4 + 101 * 2.0)


def _holding(cached: int, wait_ms: float = 900.0) -> Decision:
    terms = TtftTerms(0.0, wait_ms, 10.0, 5.0, cached_tokens=cached, uncached_tokens=64)
    return Decision("firstlight", (Candidate("r1", "here", terms.total_ms, terms),), "test")


def test_copying_a_prefix_to_a_peer_is_priced_by_the_requests_it_holds_up_there() -> None:
    # The prompt is 3 full blocks of 32; the peer's hot prefixes hold 1 (block 11), so
    # spilling prefills 64 tokens of it there at 1 ms each, and the peer's replicas
    # have 3 requests each: 64 x 1 x (1 + 3) = 256 ms, ranking only.
    request = RequestView("q", 96, (11, 12, 13), block_size=32)
    summary = ModelSummary(2, 10.0, 1.0, frozenset({11}), True, mean_queue_len=3.0)
    (choice,) = rank_peers(request, [PeerOption("p", summary, rtt_ms=20.0)], _holding(64))
    assert choice.copy_penalty_ms == pytest.approx(256.0)
    assert choice.predicted_ttft_ms == pytest.approx(20.0 + 10.0 + 64.0)  # still a TTFT
    assert choice.ranking_ms == pytest.approx(choice.predicted_ttft_ms + 256.0)
    (free,) = rank_peers(
        request, [PeerOption("p", summary, rtt_ms=20.0)], _holding(64), copy_weight=0.0
    )
    assert free.copy_penalty_ms == 0.0
    # Whether this region holds the prefix or not: building it there moves its group.
    (cold_here,) = rank_peers(request, [PeerOption("p", summary, rtt_ms=20.0)], _holding(0))
    assert cold_here.copy_penalty_ms == pytest.approx(256.0)
    # A peer holding the whole prompt's blocks pays nothing.
    warm = ModelSummary(2, 10.0, 1.0, frozenset({11, 12, 13}), True, mean_queue_len=3.0)
    (holder,) = rank_peers(request, [PeerOption("p", warm, rtt_ms=20.0)], _holding(0))
    assert holder.copy_penalty_ms == 0.0
    # Spill-over compares the ranking: a 300 ms local wait beats a 94 ms peer plus its
    # 256 ms copy (with the 50 ms margin), a 400 ms one does not.
    for wait_ms, route in ((300.0, "local"), (400.0, "spill_over")):
        local = _holding(64, wait_ms)
        peers = rank_peers(request, [PeerOption("p", summary, rtt_ms=20.0)], local)
        decision = decide_region(local, healthy=True, from_peer=False, peers=peers, router=DEFAULT)
        assert decision.route == route
