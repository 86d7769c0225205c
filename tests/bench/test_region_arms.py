"""The cross-region arms' region choices (published designs), table-driven."""

from __future__ import annotations

import pytest

from firstlight.routing import RequestView
from firstlight_bench.simulator.region_arms import (
    GORGO_W_QUEUE,
    GORGO_W_RTT,
    Gorgo,
    RateWindow,
    RegionLoad,
    WaterfallBalancer,
    global_pool,
    waterfall,
)


def load(
    index: int,
    *,
    up: bool = True,
    waiting: float = 0.0,
    kv: float = 0.0,
    hot: frozenset[int] = frozenset(),
) -> RegionLoad:
    return RegionLoad(index, up, 2 if up else 0, waiting, kv, hot)


@pytest.mark.parametrize(
    ("rates", "ups", "expected"),
    [
        ((0.0, 0.0, 0.0), (True, True, True), 0),  # home has room
        ((20.0, 0.0, 0.0), (True, True, True), 1),  # home full: the next nearest
        ((20.0, 20.0, 0.0), (True, True, True), 2),  # the excess goes on down the list
        ((20.0, 20.0, 20.0), (True, True, True), 0),  # all full: the nearest
        ((0.0, 0.0, 0.0), (False, True, True), 1),  # home down: health fail-over
        ((0.0, 0.0, 0.0), (False, False, False), None),
    ],
)
def test_waterfall_fills_the_nearest_region_to_capacity_then_overflows(
    rates: tuple[float, ...], ups: tuple[bool, ...], expected: int | None
) -> None:
    loads = [load(g, up=up) for g, up in enumerate(ups)]
    # Two replicas of 10 req/s each: 20 req/s is a region's capacity.
    assert waterfall((0, 1, 2), loads, list(rates), 10.0) == expected


def test_rate_window_counts_the_last_second() -> None:
    window = RateWindow()
    for t in (0.1, 0.5, 0.9):
        window.add(t)
    assert window.rate(1.0) == 3.0
    window.add(1.2)
    assert window.rate(1.2) == 3.0  # 0.1 left the window
    assert window.rate(1.6) == 2.0  # and 0.5


def test_the_live_waterfall_fills_the_client_region_then_the_nearest_peer() -> None:
    # Region 0's nearest peer is 2 (40 ms), then 1 (90 ms); one replica of 2 req/s each.
    rtt = [[0.0, 90.0, 40.0], [90.0, 0.0, 60.0], [40.0, 60.0, 0.0]]
    balancer = WaterfallBalancer(rtt, [1, 1, 1], 2.0)
    picks = [balancer.choose(0, 0.1 * i) for i in range(7)]
    # Every region full: the nearest, home (GKE keeps sending there).
    assert picks == [(0, 0.0), (0, 0.0), (2, 40.0), (2, 40.0), (1, 90.0), (1, 90.0), (0, 0.0)]
    # A second later the window has emptied: home again.
    assert balancer.choose(0, 2.0) == (0, 0.0)
    # Each region's rate counts what it took from every client region.
    assert balancer.choose(1, 2.05) == (1, 0.0)
    assert balancer.choose(2, 2.1) == (2, 0.0)


def test_the_live_waterfall_refuses_a_matrix_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="3 x 3"):
        WaterfallBalancer([[0.0, 1.0], [1.0, 0.0]], [1, 1, 1], 2.0)
    with pytest.raises(ValueError, match="max_rate_per_replica"):
        WaterfallBalancer([[0.0]], [1], 0.0)


def test_global_pool_scores_queue_kv_and_prefix_and_ignores_distance() -> None:
    request = RequestView("q", 64, (1, 2, 3, 4), 16)
    # Home (listed first) is busy; the far region is idle and holds the prefix.
    loads = [
        load(0, waiting=8.0, kv=0.9),
        load(1, waiting=4.0, kv=0.5),
        load(2, hot=frozenset({1, 2, 3, 4})),
    ]
    assert global_pool(request, loads) == 2
    # Equal scores: the first listed (the client's region) wins.
    assert global_pool(request, [load(0), load(1)]) == 0
    assert global_pool(request, [load(0, up=False), load(1, waiting=5.0)]) == 1
    assert global_pool(request, [load(0, up=False)]) is None


def test_gorgo_prices_rtt_uncached_tokens_and_queued_tokens_with_its_frozen_weights() -> None:
    gorgo = Gorgo(1000)
    first = RequestView("a", 640, tuple(range(40)), 16)
    # Nothing dispatched: RTT alone decides (0.276 x ms); home first.
    assert gorgo.choose(first, [("home", 0.0), ("far", 100.0)]) == "home"
    gorgo.dispatched(first, "home")
    # The same prompt again: home holds it but has 640 tokens queued (x 0.5 = 320);
    # far has nothing but misses all 640 and is 100 ms away (27.6).
    second = RequestView("b", 640, tuple(range(40)), 16)
    home_score = 0 + 0 + GORGO_W_QUEUE * 640
    far_score = GORGO_W_RTT * 100.0 + 640
    assert home_score < far_score
    assert gorgo.choose(second, [("home", 0.0), ("far", 100.0)]) == "home"
    gorgo.dispatched(second, "home")
    gorgo.dispatched(RequestView("c", 640, tuple(range(100, 140)), 16), "home")
    # Home now queues 1,920 tokens (960): a new prompt goes far (27.6 + 640).
    assert (
        gorgo.choose(
            RequestView("d", 640, tuple(range(200, 240)), 16), [("home", 0.0), ("far", 100.0)]
        )
        == "far"
    )
    for request_id in ("a", "b", "c"):
        gorgo.completed(request_id)
    assert (
        gorgo.choose(
            RequestView("e", 640, tuple(range(300, 340)), 16), [("home", 0.0), ("far", 100.0)]
        )
        == "home"
    )
    assert gorgo.choose(first, []) is None
