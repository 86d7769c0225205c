"""summarize on a hand-computed set; the results schema; the git commit label."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from firstlight_bench.reports.results import (
    DEFAULT_SLOS,
    Outcome,
    Slo,
    git_commit,
    summarize,
    validate_results,
)

# r1: TTFT 100 ms, TPOT 200 ms / 10 = 20 ms, e2e 300 ms, half its prompt cached, local.
# r2: TTFT 300 ms, TPOT 200 ms / 4 = 50 ms, e2e 500 ms, nothing cached, cross-region.
# r3: TTFT 1000 ms, 1 output token (no TPOT), e2e 1000 ms, fully cached, local.
# r4: failed before its first token.
OUTCOMES = (
    Outcome("r1", 0.0, 0.1, 0.3, 100, 11, 50, 0, 0, "a", decision_us=10.0),
    Outcome("r2", 1.0, 1.3, 1.5, 200, 5, 0, 0, 1, "b", decision_us=20.0),
    Outcome("r3", 2.0, 3.0, 3.0, 100, 1, 100, 1, 1, "b"),
    Outcome("r4", 3.0, None, None, 50, 0, 0, 1, None, None, "timeout", decision_us=30.0),
)


def _meta(**overrides: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "seed": 7,
        "git_commit": "abc123",
        "config": {"replicas": 8},
        "workload": {"name": "W1 shared prefix"},
        "simulated": True,
        "created_at": "2025-01-01T00:00:00Z",
    }
    meta.update(overrides)
    return meta


def test_summarize_matches_the_hand_computed_values() -> None:
    point = summarize("least_queue", 0.5, OUTCOMES, imbalance=1.25)
    approx = pytest.approx
    assert point["arm"] == "least_queue"
    assert point["load"] == 0.5
    # TTFT [100, 300, 1000]: p90 at rank 1.8 = 300 + 0.8 * 700, p99 at 1.98.
    assert point["ttft_ms"] == approx({"p50": 300.0, "p90": 860.0, "p99": 986.0})
    # TPOT [20, 50]: p90 at rank 0.9 = 20 + 0.9 * 30.
    assert point["tpot_ms"] == approx({"p50": 35.0, "p90": 47.0, "p99": 49.7})
    assert point["e2e_ms"] == approx({"p50": 500.0, "p99": 990.0})
    assert point["prefix_hit_rate"] == approx(150 / 400)  # r4 is not completed
    assert point["goodput"] == approx(1 / 4)  # only r1 meets 500 ms / 30 ms
    assert point["goodput_by_slo"] == approx({"500ms/30ms": 0.25, "2000ms/100ms": 0.75})
    assert point["completed"] == 3
    assert point["errors"] == 1
    assert point["cross_region_share"] == approx(1 / 3)
    assert point["imbalance"] == 1.25
    assert point["decision_us"] == approx({"p50": 20.0, "p99": 29.8})
    assert "duration_s" not in point
    validate_results({"meta": _meta(), "points": [point]})


def test_goodput_follows_the_first_slo_pair_given() -> None:
    point = summarize("a", 1.0, OUTCOMES, imbalance=1.0, slos=(Slo(2000, 100),))
    assert point["goodput"] == pytest.approx(0.75)
    assert list(point["goodput_by_slo"]) == ["2000ms/100ms"]


def test_duration_adds_throughput() -> None:
    point = summarize("a", 1.0, OUTCOMES, imbalance=1.0, duration_s=4.0)
    assert point["duration_s"] == 4.0
    assert point["throughput_rps"] == pytest.approx(3 / 4)
    assert point["output_tokens_per_s"] == pytest.approx(17 / 4)
    validate_results({"meta": _meta(), "points": [point]})


@pytest.mark.parametrize(
    ("outcomes", "completed", "errors", "goodput"),
    [
        ((), 0, 0, None),
        ((OUTCOMES[3],), 0, 1, 0.0),
    ],
    ids=["no requests", "only errors"],
)
def test_empty_sets_give_nulls_not_nan(
    outcomes: tuple[Outcome, ...], completed: int, errors: int, goodput: float | None
) -> None:
    point = summarize("a", 0.2, outcomes, imbalance=0.0)
    assert point["ttft_ms"] == {"p50": None, "p90": None, "p99": None}
    assert point["tpot_ms"] == {"p50": None, "p90": None, "p99": None}
    assert point["e2e_ms"] == {"p50": None, "p99": None}
    assert point["prefix_hit_rate"] is None
    assert point["cross_region_share"] is None
    assert point["goodput"] == goodput
    assert (point["completed"], point["errors"]) == (completed, errors)
    json.dumps(point, allow_nan=False)
    validate_results({"meta": _meta(), "points": [point]})


def test_decision_time_is_null_when_never_measured() -> None:
    point = summarize("a", 0.2, OUTCOMES[2:3], imbalance=1.0)
    assert point["decision_us"] == {"p50": None, "p99": None}
    assert point["tpot_ms"] == {"p50": None, "p90": None, "p99": None}  # one token: no TPOT
    assert point["goodput_by_slo"] == {"500ms/30ms": 0.0, "2000ms/100ms": 1.0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cached_tokens": 101}, "cached_tokens = 101 exceeds prompt_tokens = 100"),
        ({"output_tokens": -1}, "output_tokens = -1 is negative"),
        ({"finish_s": None}, "finish_s is None"),
        ({"first_token_s": None}, "first_token_s is None"),
        ({"first_token_s": -1.0}, "precedes arrival_s"),
        ({"finish_s": 0.05}, "finish_s = 0.05 precedes"),
    ],
)
def test_contradictory_outcomes_are_refused(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {
        "request_id": "x",
        "arrival_s": 0.0,
        "first_token_s": 0.1,
        "finish_s": 0.3,
        "prompt_tokens": 100,
        "output_tokens": 11,
        "cached_tokens": 0,
        "client_region": 0,
        "served_region": 0,
        "replica": "a",
    }
    with pytest.raises(ValueError, match=message):
        Outcome(**(fields | kwargs))


def test_a_tool_records_what_it_measures_and_a_failure_may_keep_its_end() -> None:
    """A tool that times requests one by one (the closed loop) leaves the routing fields
    at their defaults, and may record when a failed request ended: that gives it an e2e,
    which never counts in a point's."""
    hung = Outcome("7", 2.0, None, 2.5, error="hung")
    assert (hung.prompt_tokens, hung.output_tokens, hung.cached_tokens) == (0, 0, 0)
    assert (hung.client_region, hung.served_region, hung.replica) == (0, None, None)
    assert not hung.completed
    assert hung.e2e_ms == 500.0
    point = summarize("a", 1.0, [hung, OUTCOMES[0]], imbalance=1.0)
    assert (point["completed"], point["errors"]) == (1, 1)
    assert point["e2e_ms"] == pytest.approx({"p50": 300.0, "p99": 300.0})


def test_floor_ratios_are_percentile_over_percentile() -> None:
    # Floors of the four requests (all of them, failed ones included): 50, 100, 150, 200.
    point = summarize("a", 0.5, OUTCOMES, imbalance=1.0, seed=3, floor_ttft_ms=[50, 100, 150, 200])
    assert point["seed"] == 3
    assert point["floor_ttft_ms"] == pytest.approx({"p50": 125.0, "p90": 185.0, "p99": 198.5})
    # Arm TTFT p50 300 / 125, p90 860 / 185.
    assert point["ttft_vs_floor"] == pytest.approx({"p50": 2.4, "p90": 860 / 185})
    validate_results({"meta": _meta(), "points": [point]})
    no_ttft = summarize("a", 0.5, OUTCOMES[3:], imbalance=1.0, floor_ttft_ms=[50.0])
    assert no_ttft["ttft_vs_floor"] == {"p50": None, "p90": None}


def test_points_of_other_seeds_are_not_repeats() -> None:
    points = [summarize("a", 0.5, OUTCOMES, imbalance=1.0, seed=s) for s in (0, 1)]
    validate_results({"meta": _meta(), "points": points})
    points.append(summarize("a", 0.5, OUTCOMES, imbalance=1.0, seed=1))
    with pytest.raises(ValueError, match=r"points\[2\]: arm 'a' at load 0.5 on seed 1 repeats"):
        validate_results({"meta": _meta(), "points": points})


def test_summarize_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="imbalance"):
        summarize("a", 0.5, OUTCOMES, imbalance=math.nan)
    with pytest.raises(ValueError, match="slos"):
        summarize("a", 0.5, OUTCOMES, imbalance=1.0, slos=())
    assert (Slo(500, 30), Slo(2000, 100)) == DEFAULT_SLOS


def _valid() -> dict[str, Any]:
    points = [summarize(arm, 0.5, OUTCOMES, imbalance=1.1) for arm in ("a", "b")]
    return {"meta": _meta(command="firstlight bench --seed 7"), "points": points}


def _drop(data: dict[str, Any], *path: Any) -> None:
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]


def _put(value: Any, *path: Any) -> Any:
    def edit(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: _drop(d, "points", 1, "goodput"),
            r"\$\.points\[1\]: 'goodput' is a required property",
        ),
        (lambda d: _drop(d, "meta", "seed"), r"\$\.meta: 'seed' is a required property"),
        (_put("7", "meta", "seed"), r"\$\.meta\.seed: '7' is not of type 'integer'"),
        (_put("yes", "meta", "simulated"), r"\$\.meta\.simulated: 'yes' is not of type 'boolean'"),
        (
            _put("high", "points", 0, "load"),
            r"\$\.points\[0\]\.load: 'high' is not of type 'number'",
        ),
        (
            _put("1", "points", 1, "ttft_ms", "p99"),
            r"\$\.points\[1\]\.ttft_ms\.p99: '1' is not of type 'number', 'null'",
        ),
        (
            _put(1.5, "points", 0, "goodput"),
            r"\$\.points\[0\]\.goodput: 1\.5 is greater than the maximum of 1",
        ),
        (
            _put(2.5, "points", 0, "completed"),
            r"\$\.points\[0\]\.completed: 2\.5 is not of type 'integer'",
        ),
        (
            _put(1, "points", 0, "throughput"),
            r"\$\.points\[0\]: Additional properties are not allowed",
        ),
        (
            _put(math.nan, "points", 0, "tpot_ms", "p50"),
            r"\$\.points\[0\]\.tpot_ms\.p50: not a finite number",
        ),
        (
            _put("a", "points", 1, "arm"),
            r"\$\.points\[1\]: arm 'a' at load 0\.5 repeats \$\.points\[0\]",
        ),
        (_put([], "points"), r"\$\.points: \[\] should be non-empty"),
    ],
    ids=[
        "missing point key",
        "missing meta key",
        "seed type",
        "simulated type",
        "load type",
        "percentile type",
        "fraction bound",
        "integer count",
        "extra point key",
        "nan",
        "duplicate point",
        "no points",
    ],
)
def test_schema_names_the_path_of_the_problem(edit: Any, message: str) -> None:
    data = _valid()
    validate_results(copy.deepcopy(data))
    edit(data)
    with pytest.raises(ValueError, match=message):
        validate_results(data)


def test_meta_may_carry_more_keys() -> None:
    data = _valid()
    data["meta"]["host"] = {"cpus": 2}
    validate_results(data)


def test_git_commit_outside_a_checkout_is_unknown(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
    assert git_commit(tmp_path / "missing") == "unknown"


def test_git_commit_marks_a_dirty_tree(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("commit", "-q", "--no-verify", "-m", "first")
    clean = git_commit(tmp_path)
    assert len(clean) == 40
    assert set(clean) <= set("0123456789abcdef")
    (tmp_path / "a.txt").write_text("b\n")
    assert git_commit(tmp_path) == f"{clean}-dirty"


def test_the_prediction_error_is_relative_to_the_measured_ttft() -> None:
    outcomes = [
        dataclasses.replace(OUTCOMES[0], predicted_ttft_ms=120.0),  # 100 measured: 20 %
        dataclasses.replace(OUTCOMES[1], predicted_ttft_ms=150.0),  # 300 measured: 50 %
        OUTCOMES[2],  # nothing predicted it: left out
    ]
    point = summarize("firstlight", 0.5, outcomes, imbalance=1.0)
    assert point["prediction_ape"] == pytest.approx({"p50": 0.35, "p90": 0.47})
    validate_results({"meta": _meta(), "points": [point]})
    assert "prediction_ape" not in summarize("x", 0.5, OUTCOMES, imbalance=1.0)
