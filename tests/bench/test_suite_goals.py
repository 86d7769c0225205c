"""The goals table: each verdict follows from the stored points (table-driven fakes of
``results.json``)."""

from __future__ import annotations

from typing import Any

from firstlight_bench.reports.suite_goals import goals_table

LOADS = (0.5, 0.75, 0.9, 1.0, 1.2)


def _point(arm: str, load: float, seed: int, p50: float, p90: float, p99: float) -> dict[str, Any]:
    return {
        "arm": arm,
        "load": load,
        "seed": seed,
        "ttft_ms": {"p50": p50, "p90": p90, "p99": p99},
        "floor_ttft_ms": {"p50": 10.0},
    }


def _run(
    workload: str, rows: dict[tuple[str, float], tuple[float, float, float]]
) -> dict[str, Any]:
    """Two seeds per (arm, load), 1 % apart, so a gap of more than that is a verdict."""
    points = [
        _point(arm, load, seed, *(v * (1 + 0.01 * seed) for v in values))
        for (arm, load), values in rows.items()
        for seed in (0, 1)
    ]
    return {"meta": {"workload": {"name": workload}}, "points": points}


def _row(lines: list[str], goal: str) -> str:
    return next(line for line in lines if line.startswith(f"| {goal}"))


def test_every_goal_met_reads_met() -> None:
    w7 = _run(
        "W7",
        {
            ("firstlight", 0.5): (11.0, 20.0, 30.0),
            ("firstlight_local", 0.5): (11.0, 20.0, 30.0),
            ("least_queue", 0.5): (20.0, 40.0, 60.0),
            ("firstlight", 1.0): (30.0, 50.0, 80.0),
            ("firstlight_local", 1.0): (30.0, 60.0, 160.0),
            ("least_queue", 1.0): (60.0, 100.0, 200.0),
        },
    )
    lines = goals_table({"w7": w7}, ["w7"], LOADS)
    assert _row(lines, "never the worse").endswith("| 0 losses in 4 comparisons | met |")
    assert _row(lines, "p90 ≤ 0.7x").endswith("| w7 1: x0.50 | met |")
    assert _row(lines, "p50 ≤ 1.2x").endswith("| highest p50 ÷ floor p50: w7: x1.11 | met |")
    assert _row(lines, "spill-over").endswith("| raised in 0 of 2 points | met |")
    assert not any(line.startswith("Not stored yet") for line in lines)


def test_a_loss_a_weak_win_a_slow_median_and_a_harmful_spill_are_each_missed() -> None:
    w6 = _run(
        "W6",
        {
            ("firstlight", 0.5): (15.0, 20.0, 30.0),  # p50 is no goal on W6
            ("firstlight_local", 0.5): (15.0, 20.0, 20.0),  # spill-over raised p99
            ("cache_aware", 0.5): (15.0, 20.0, 25.0),  # firstlight's p99 loses
            ("firstlight", 1.2): (30.0, 80.0, 100.0),
            ("firstlight_local", 1.2): (30.0, 80.0, 100.0),
            ("cache_aware", 1.2): (30.0, 100.0, 100.0),  # a win, but only x0.80
        },
    )
    w2 = _run("W2", {("firstlight", 0.75): (13.0, 20.0, 30.0), ("random", 0.75): (9.0, 90.0, 99.0)})
    lines = goals_table({"w6": w6, "w2": w2}, ["w2", "w3", "w6"], LOADS)
    assert "| 1 losses in 6 comparisons: w6 p99 at 0.5 (x1.20 vs cache_aware) | **missed** |" in (
        _row(lines, "never the worse")
    )
    assert _row(lines, "p90 ≤ 0.7x").endswith("| w6 1.2: x0.80 | **missed** |")
    assert _row(lines, "p50 ≤ 1.2x").endswith("| highest p50 ÷ floor p50: w2: x1.31 | **missed** |")
    spill = _row(lines, "spill-over")
    assert "raised in 1 of 2 points: w6 at 0.5 (x1.50)" in spill
    assert "W6 p99 ÷ firstlight_local's at 0.5: x1.50, 1.2: x1.00" in spill
    assert spill.endswith("| **missed** |")
    assert "Not stored yet, so not counted: w3." in lines


def test_goals_without_their_workloads_are_not_measured() -> None:
    w3 = _run(
        "W3", {("firstlight", 0.9): (10.0, 20.0, 30.0), ("least_queue", 0.9): (10.0, 20.0, 30.0)}
    )
    lines = goals_table({"w3": w3}, ["w3"], LOADS)
    assert _row(lines, "p90 ≤ 0.7x").endswith("| no W6/W7/W8 run stored | not measured |")
    assert _row(lines, "p50 ≤ 1.2x").endswith("| no run stored | not measured |")
    assert _row(lines, "spill-over").endswith("| raised in 0 of 0 points | not measured |")


def test_points_beyond_the_matrix_do_not_count() -> None:
    stress = _run(
        "W1", {("firstlight", 8.0): (90.0, 900.0, 990.0), ("cache_aware", 8.0): (9.0, 90.0, 99.0)}
    )
    lines = goals_table({"w1-overload": stress}, [], LOADS)
    assert _row(lines, "never the worse").endswith("| 0 losses in 0 comparisons | not measured |")
    assert goals_table({"w1-overload": stress}, [], (8.0,))[2].endswith("| **missed** |")


def test_the_untuned_shapes_have_a_row_of_their_own() -> None:
    unseen = _run(
        "W4",
        {
            ("firstlight", 0.9): (10.0, 20.0, 30.0),
            ("prefix_affinity", 0.9): (10.0, 18.0, 30.0),  # firstlight's p90 loses
        },
    )
    matrix = _run(
        "W3", {("firstlight", 0.9): (10.0, 20.0, 30.0), ("least_queue", 0.9): (10.0, 20.0, 30.0)}
    )
    lines = goals_table({"w3": matrix}, ["w3"], LOADS, unseen={"w4-unseen": unseen})
    # The matrix's own row does not count them ...
    assert _row(lines, "never the worse").endswith("| 0 losses in 2 comparisons | met |")
    # ... their row does.
    row = _row(lines, "no loss where nobody tuned (w4-unseen)")
    assert "1 losses in 2 comparisons: w4-unseen p90 at 0.9 (x1.11 vs prefix_affinity)" in row
    assert row.endswith("| **missed** |")
    assert _row(goals_table({}, [], LOADS, unseen={}), "no loss where nobody tuned (none").endswith(
        "| not measured |"
    )
    assert not any("nobody tuned" in line for line in goals_table({}, [], LOADS))
