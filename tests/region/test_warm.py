"""The warm region priced: recompute here, forward to the peer that holds the prefix, or
pull its KV here (the simulator's three ways)."""

from __future__ import annotations

import pytest

from firstlight.region import PeerChoice, RegionDecision
from firstlight.region.warm import WarmPrices, choose_warm, price_warm, transfer_ms
from firstlight.routing import Candidate, Decision, RequestView
from firstlight.routing.decision import TtftTerms

BLOCK = 16
REQUEST = RequestView("q", 4000, tuple(range(250)), BLOCK)


def _local(wait_ms: float, cached: int = 0, ms_per_token: float = 0.05) -> Decision:
    uncached = REQUEST.prompt_tokens - cached
    terms = TtftTerms(
        0.0, wait_ms, uncached * ms_per_token, 10.0, cached_tokens=cached, uncached_tokens=uncached
    )
    return Decision("firstlight", (Candidate("r1", "here", terms.total_ms, terms),), "test")


def _peer(cached: int, predicted_ms: float, region: str = "1") -> PeerChoice:
    return PeerChoice(region, predicted_ms, cached_tokens=cached)


def test_transfer_time_is_bytes_over_the_link() -> None:
    # 1,000 tokens x 131,072 B = 131 MB = 1.05 Gbit: 10.5 ms at 100 Gbit/s.
    assert transfer_ms(1000, 131_072, 100.0) == pytest.approx(10.48576)


def test_the_three_prices_follow_the_cost_model_terms() -> None:
    local = _local(wait_ms=100.0, cached=0)  # 200 ms prefill + 100 wait + 10 overhead
    peers = (_peer(3200, 180.0),)
    prices = price_warm(
        REQUEST, local, peers, {"1": 70.0}, kv_bytes_per_token=131_072, wan_gbps=100.0
    )
    assert prices is not None
    assert prices.peer == "1"
    assert prices.pull_tokens == 3200
    assert prices.pull_bytes == 3200 * 131_072
    assert prices.recompute_ms == pytest.approx(310.0)
    assert prices.forward_ms == 180.0
    # 70 ms round trip + 33.6 ms transfer + 100 wait + 10 overhead + 800 tokens x 0.05
    assert prices.pull_ms == pytest.approx(70.0 + transfer_ms(3200, 131_072, 100.0) + 150.0)


def test_the_warm_peer_is_the_one_holding_the_longest_prefix() -> None:
    peers = (_peer(1600, 90.0, "near"), _peer(3200, 400.0, "far"))
    prices = price_warm(
        REQUEST,
        _local(0.0),
        peers,
        {"near": 20.0, "far": 150.0},
        kv_bytes_per_token=1,
        wan_gbps=1.0,
    )
    assert prices is not None
    assert (prices.peer, prices.pull_tokens) == ("far", 3200)


@pytest.mark.parametrize(
    ("local", "peers", "kv_bytes"),
    [
        (_local(0.0, cached=3200), (_peer(3200, 50.0),), 131_072),  # as warm here
        (_local(0.0, cached=3200), (_peer(3210, 50.0),), 131_072),  # less than a block more
        (_local(0.0), (), 131_072),  # no peer
        (_local(0.0), (_peer(3200, 50.0),), 0),  # KV size unknown
        (None, (_peer(3200, 50.0),), 131_072),  # no local estimate
    ],
    ids=["as-warm-here", "under-a-block", "no-peer", "unknown-kv-size", "no-local"],
)
def test_not_a_warm_request(
    local: Decision | None, peers: tuple[PeerChoice, ...], kv_bytes: int
) -> None:
    assert (
        price_warm(REQUEST, local, peers, {"1": 10.0}, kv_bytes_per_token=kv_bytes, wan_gbps=10.0)
        is None
    )


def _prices(wan_gbps: float, wait_ms: float = 100.0) -> WarmPrices | None:
    return price_warm(
        REQUEST,
        _local(wait_ms),
        (_peer(3200, 500.0),),
        {"1": 70.0},
        kv_bytes_per_token=131_072,
        wan_gbps=wan_gbps,
    )


def test_a_fast_link_makes_the_pull_win_over_recompute_and_a_slow_one_loses() -> None:
    local = RegionDecision("local", _local(100.0))
    fast, slow = _prices(100.0), _prices(1.0)
    assert fast is not None
    assert slow is not None
    assert choose_warm(fast, local) == "pull"
    assert choose_warm(slow, local) == "recompute"


def test_a_spill_over_is_kept_unless_the_pull_beats_its_peer_too() -> None:
    prices = _prices(100.0)
    assert prices is not None
    cheap_peer = RegionDecision("spill_over", _local(100.0), (PeerChoice("1", 100.0),), "local")
    dear_peer = RegionDecision("spill_over", _local(100.0), (PeerChoice("1", 900.0),), "local")
    assert choose_warm(prices, cheap_peer) == "forward"
    assert choose_warm(prices, dear_peer) == "pull"


@pytest.mark.parametrize("route", ["overflow", "fail_over", "refuse", "from_peer"])
def test_other_routes_are_not_a_choice_of_three(route: str) -> None:
    prices = _prices(100.0)
    assert prices is not None
    decision = RegionDecision(route, _local(100.0))  # type: ignore[arg-type]
    assert choose_warm(prices, decision) is None
