"""Means, spreads and verdicts over several seeds (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from firstlight_bench.reports.spread import (
    Spread,
    best_other,
    mean_points,
    spread_of,
    spreads,
    verdict,
)


def _point(arm: str, load: float, seed: int, p90: float | None, hit: float = 0.5) -> Any:
    return {
        "arm": arm,
        "load": load,
        "seed": seed,
        "ttft_ms": {"p50": 1.0, "p90": p90, "p99": None},
        "prefix_hit_rate": hit,
        "completed": 10 + seed,
    }


def test_spread_of_ignores_missing_values_and_none_is_none() -> None:
    assert spread_of([3.0, None, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert spread_of([None, None]) is None


def test_mean_points_average_every_number_over_the_seeds() -> None:
    points = [_point("a", 0.5, 0, 10.0, 0.2), _point("a", 0.5, 1, 20.0, 0.4)]
    points.append(_point("b", 0.5, 0, None))
    means = mean_points(points)
    assert [(m["arm"], m["load"], m["seeds"]) for m in means] == [("a", 0.5, 2), ("b", 0.5, 1)]
    a = means[0]
    assert "seed" not in a
    assert a["ttft_ms"] == {"p50": 1.0, "p90": 15.0, "p99": None}
    assert a["prefix_hit_rate"] == pytest.approx(0.3)
    assert a["completed"] == 10.5
    assert means[1]["ttft_ms"]["p90"] is None


def test_spreads_group_by_arm_and_load() -> None:
    points = [_point("a", 0.5, s, 10.0 + s) for s in range(3)] + [_point("a", 1.0, 0, 99.0)]
    found = spreads(points, ("ttft_ms", "p90"))
    assert found[("a", 0.5)] == Spread(11.0, 10.0, 12.0, 3)
    assert found[("a", 1.0)] == Spread(99.0, 99.0, 99.0, 1)
    assert spreads(points, ("ttft_ms", "p99")) == {}


@pytest.mark.parametrize(
    ("mine", "other", "expected"),
    [
        ((10, 9, 11), (20, 19, 21), "win"),
        ((20, 19, 21), (10, 9, 11), "loss"),
        ((10, 9, 15), (14, 12, 16), "tie"),  # overlapping spreads: no verdict
        ((10, 9, 11.5), (12, 11.5, 13), "tie"),  # touching is overlapping
    ],
)
def test_a_verdict_counts_only_outside_the_spread(
    mine: tuple[float, float, float], other: tuple[float, float, float], expected: str
) -> None:
    assert verdict(Spread(*mine, 3), Spread(*other, 3)) == expected


def test_higher_is_better_flips_the_verdict() -> None:
    high, low = Spread(0.9, 0.88, 0.92, 3), Spread(0.5, 0.4, 0.6, 3)
    assert verdict(high, low, lower_is_better=False) == "win"
    assert verdict(low, high, lower_is_better=False) == "loss"


def test_best_other_leaves_out_the_same_policy() -> None:
    by_arm = {
        "firstlight": Spread(5, 5, 5, 3),
        "firstlight_local": Spread(1, 1, 1, 3),
        "least_queue": Spread(9, 9, 9, 3),
        "cache_aware": Spread(7, 7, 7, 3),
    }
    assert best_other(by_arm, "firstlight") == ("cache_aware", by_arm["cache_aware"])
    assert best_other(by_arm, "cache_aware") == ("firstlight_local", by_arm["firstlight_local"])
    assert best_other({"firstlight": Spread(1, 1, 1, 1)}, "firstlight") is None
