"""The hour-by-hour view of a multi-region day (W6), on hand-made outcomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight_bench.reports.day_plot import plot_run
from firstlight_bench.reports.day_report import day_tables
from firstlight_bench.reports.results import Outcome
from firstlight_bench.simulator.day import BYTES_PER_TOKEN, day_metrics, in_peak
from firstlight_bench.simulator.sim import run_sim
from firstlight_bench.workloads import FleetEvent


def outcome(
    rid: str,
    arrival: float,
    ttft_ms: float,
    client: int,
    served: int | None,
    error: str | None = None,
) -> Outcome:
    first = None if error else arrival + ttft_ms / 1000
    return Outcome(
        request_id=rid,
        arrival_s=arrival,
        first_token_s=first,
        finish_s=None if error else arrival + 1.0,
        prompt_tokens=100,
        output_tokens=0 if error else 10,
        cached_tokens=0,
        client_region=client,
        served_region=served,
        replica=None if served is None else f"g{served}-r00",
        error=error,
    )


def test_peaks_are_the_middle_half_of_each_regions_slice() -> None:
    # Two regions over a 2,400 s day: region 0 peaks in [300, 900), region 1 in [1500, 2100).
    assert [in_peak(t, 0, 2, 2400.0) for t in (299.0, 300.0, 899.0, 900.0)] == [
        False,
        True,
        True,
        False,
    ]
    assert in_peak(1500.0, 1, 2, 2400.0)
    assert not in_peak(1500.0, 0, 2, 2400.0)
    assert in_peak(2400.0 + 300.0, 0, 2, 2400.0)  # days repeat


def test_hours_peaks_and_events_are_counted_per_client_region() -> None:
    period = 2400.0  # an hour is 100 s
    outcomes = [
        outcome("a", 10.0, 50.0, 0, 0),
        outcome("b", 20.0, 150.0, 0, 1),  # hour 0, served abroad
        outcome("c", 350.0, 400.0, 0, 0),  # hour 3: region 0's peak
        outcome("d", 360.0, 0.0, 0, None, error="no region can serve it"),
        outcome("e", 1600.0, 80.0, 1, 1),  # hour 16: region 1's peak
    ]
    day = day_metrics(
        outcomes, period_s=period, regions=2, events=(FleetEvent("outage", 0, 300.0, 400.0),)
    )
    first = day["hours"][0]
    assert (first["hour"], first["region"], first["requests"]) == (0, 0, 2)
    assert first["served_elsewhere"] == pytest.approx(0.5)
    assert first["served_in"] == {"1": 1}
    assert first["crossing_bytes"] == (100 + 10) * BYTES_PER_TOKEN
    assert first["ttft_p99_ms"] == pytest.approx(150.0, rel=0.02)
    third = next(h for h in day["hours"] if (h["hour"], h["region"]) == (3, 0))
    assert (third["requests"], third["lost"], third["served_elsewhere"]) == (2, 1, 0.0)
    assert day["peak"]["requests"] == 3  # c, d (region 0's peak) and e (region 1's)
    assert day["peak"]["ttft_ms"]["p99"] == pytest.approx(400.0, rel=0.02)
    (event,) = day["events"]
    assert (event["kind"], event["requests"], event["lost"]) == ("outage", 2, 1)
    assert (event["start_h"], event["end_h"]) == pytest.approx((3.0, 4.0))
    assert event["ttft_ms"]["p99"] == pytest.approx(400.0)


def test_a_w6_run_stores_its_day_and_the_page_reads_it(tmp_path: Path) -> None:
    period = 48.0  # a 48 s day: two 1-replica regions, small prompts
    run_sim(
        workload="W6",
        regions=2,
        replicas=1,
        seeds=[0],
        arms=["firstlight", "firstlight_local", "waterfall"],
        loads=[0.6],
        out=tmp_path,
        requests=300,
        params={"period_s": period, "system_tokens": 256, "groups": 4},
    )
    data = json.loads((tmp_path / "results.json").read_text())
    # The run writer drew the day's picture with the run (no separate step to forget).
    assert (tmp_path / "day_load0.6.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = data["meta"]["config"]
    assert (config["day_s"], config["capacity_arm"]) == (period, "cache_aware")
    expected = round(0.6 * config["capacity_rps"] * period)  # one day at the load's rate
    for point in data["points"]:
        assert point["completed"] + point["errors"] == expected
        day = point["day"]
        assert {(h["hour"], h["region"]) for h in day["hours"]} == {
            (hour, region) for hour in range(24) for region in range(2)
        }
        assert sum(h["requests"] for h in day["hours"]) == expected
        assert [e["kind"] for e in day["events"]] == ["outage", "brownout"]
    local = next(p for p in data["points"] if p["arm"] == "firstlight_local")
    # Region-local: abroad only while its region is down (region 0's peak, hours 5.5-6.5),
    # and the requests it held then (some arrived in hour 4).
    away = {(h["hour"], h["region"]) for h in local["day"]["hours"] if h["served_elsewhere"]}
    assert {(5, 0), (6, 0)} <= away <= {(4, 0), (5, 0), (6, 0)}
    text = "\n".join(day_tables(data["points"]))
    assert "| firstlight_local |" in text
    assert "0 of 48" in text  # firstlight_local against itself
    assert "outage: p99 ≤ 0.5x firstlight_local, 0 lost" in text
    (picture,) = plot_run(tmp_path)
    assert picture.name == "day_load0.6.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
