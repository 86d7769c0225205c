"""The dashboard's rolling windows: exact percentiles, window expiry, bounded memory and
the recent ratio of two cumulative counters, on an injected clock."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.quantiles import percentile
from firstlight.telemetry.rolling import CounterRatio, RollingCounts, RollingSamples
from tests.conftest import FakeClock

QUANTILES = (0.5, 0.95, 0.99)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([7.0], 0.0, 7.0),
        ([7.0], 0.99, 7.0),
        ([1.0, 2.0], 0.5, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0.25, 1.75),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.95, 48.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.5, 30.0),
        ([0.0, 100.0], 0.99, 99.0),
    ],
)
def test_percentile_exact(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize("q", [-0.01, 1.01])
def test_percentile_rejects_q_outside_unit_interval(q: float) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        percentile([1.0, 2.0], q)


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=2, max_size=60))
def test_percentile_matches_statistics_inclusive(values: list[float]) -> None:
    ordered = sorted(values)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    for q in QUANTILES:
        expected = cuts[round(q * 100) - 1]
        assert percentile(ordered, q) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@given(st.lists(finite, min_size=1, max_size=60))
def test_percentiles_are_ordered_and_within_range(values: list[float]) -> None:
    ordered = sorted(values)
    p50, p95, p99 = (percentile(ordered, q) for q in QUANTILES)
    assert p50 is not None
    assert p95 is not None
    assert p99 is not None
    assert ordered[0] <= p50 <= p95 <= p99 <= ordered[-1]


def test_summary_keys_and_count() -> None:
    clock = FakeClock()
    samples = RollingSamples(window_s=60.0, clock=clock)
    assert samples.summary() == {"p50": None, "p95": None, "p99": None, "count": 0.0}
    for value in (5.0, 1.0, 3.0, 2.0, 4.0):  # unsorted on purpose
        samples.add(value)
    summary = samples.summary()
    assert summary["count"] == 5.0
    assert summary["p50"] == pytest.approx(3.0)
    assert summary["p95"] == pytest.approx(4.8)
    assert summary["p99"] == pytest.approx(4.96)
    assert samples.summary(quantiles=(0.1,)) == {"p10": pytest.approx(1.4), "count": 5.0}


def test_samples_expire_after_the_window() -> None:
    clock = FakeClock()
    samples = RollingSamples(window_s=60.0, clock=clock)
    samples.add(1.0)
    clock.advance(30.0)
    samples.add(2.0)
    clock.advance(30.0)  # the first sample is exactly window_s old: still in
    assert samples.values() == [1.0, 2.0]
    clock.advance(0.001)
    assert samples.values() == [2.0]
    clock.advance(30.0)
    assert samples.values() == []
    assert samples.summary()["count"] == 0.0


def test_samples_bounded_by_max_samples_oldest_first() -> None:
    samples = RollingSamples(window_s=60.0, max_samples=3, clock=FakeClock())
    for value in range(5):
        samples.add(float(value))
    assert samples.values() == [2.0, 3.0, 4.0]


def test_counts_by_key_over_the_window() -> None:
    clock = FakeClock()
    counts = RollingCounts(window_s=10.0, clock=clock)
    counts.add("local")
    counts.add("spill_over")
    clock.advance(5.0)
    counts.add("local")
    assert counts.counts() == {"local": 2, "spill_over": 1}
    clock.advance(5.5)
    assert counts.counts() == {"local": 1}
    clock.advance(5.0)
    assert counts.counts() == {}


def test_counts_bounded_by_max_events() -> None:
    counts = RollingCounts(window_s=10.0, max_events=2, clock=FakeClock())
    for key in ("a", "b", "c"):
        counts.add(key)
    assert counts.counts() == {"b": 1, "c": 1}


def test_ratio_needs_two_points() -> None:
    ratio = CounterRatio(window_s=60.0, clock=FakeClock())
    assert ratio.ratio() is None
    ratio.observe(5.0, 10.0)
    assert ratio.ratio() is None


def test_ratio_is_the_increase_over_the_window() -> None:
    clock = FakeClock()
    ratio = CounterRatio(window_s=60.0, clock=clock)
    # (t, hits, queried): the first 40 s hit everything, the rest nothing.
    points = [(0, 0, 0), (20, 100, 100), (40, 200, 200), (60, 200, 300), (80, 200, 400)]
    start = clock.now
    for t, hits, queried in points:
        clock.now = start + t
        ratio.observe(hits, queried)
    # Horizon at t=20: the window is t=20..80, hits +100 of queried +300.
    assert ratio.ratio() == pytest.approx(100 / 300)
    clock.now = start + 140
    ratio.observe(200, 500)
    # Horizon at t=80: only the last two points count.
    assert ratio.ratio() == pytest.approx(0.0)


def test_ratio_keeps_one_point_before_the_horizon() -> None:
    clock = FakeClock()
    ratio = CounterRatio(window_s=10.0, clock=clock)
    ratio.observe(0, 0)
    clock.advance(100.0)  # a long gap: the old point still anchors the window
    ratio.observe(30, 60)
    assert ratio.ratio() == pytest.approx(0.5)


def test_ratio_is_none_when_the_denominator_did_not_move() -> None:
    clock = FakeClock()
    ratio = CounterRatio(window_s=60.0, clock=clock)
    ratio.observe(10, 50)
    clock.advance(1.0)
    ratio.observe(10, 50)
    assert ratio.ratio() is None


@pytest.mark.parametrize(
    "restart",
    [(5.0, 500.0), (50.0, 40.0), (0.0, 0.0)],
    ids=["numerator-down", "denominator-down", "both-reset"],
)
def test_ratio_starts_afresh_when_a_counter_goes_down(restart: tuple[float, float]) -> None:
    clock = FakeClock()
    ratio = CounterRatio(window_s=60.0, clock=clock)
    ratio.observe(10, 100)
    clock.advance(1.0)
    ratio.observe(60, 200)
    assert ratio.ratio() == pytest.approx(0.5)
    clock.advance(1.0)
    ratio.observe(*restart)  # the replica restarted: its counters began again
    assert ratio.ratio() is None
    clock.advance(1.0)
    hits, queried = restart
    ratio.observe(hits + 9, queried + 10)
    assert ratio.ratio() == pytest.approx(0.9)
