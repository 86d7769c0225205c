"""The warm region in the simulator: users who move between regions, the three ways
priced and taken, the pulled KV landing, and the hindsight replays on forks."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from firstlight.errors import ConfigError
from firstlight_bench.simulator.cluster import ClusterSpec, block_hashes
from firstlight_bench.simulator.des import _Run, simulate
from firstlight_bench.simulator.sim import default_rtt_ms
from firstlight_bench.simulator.warm import WarmRecord, warm_metrics, warm_table
from firstlight_bench.workloads import Workload, generate

TRACE = str(Path(__file__).parent / "data" / "mooncake-synthetic.jsonl")


def _moving(move_probability: float = 0.6, requests: int = 150) -> Workload:
    return generate(
        "W7",
        seed=1,
        rate_rps=6.0,
        num_requests=requests,
        regions=3,
        trace=TRACE,
        move_probability=move_probability,
    )


def _cluster(wan_gbps: float | None, **overrides: object) -> ClusterSpec:
    return ClusterSpec(
        3,
        1,
        rtt_ms=default_rtt_ms(3),
        kv_cache_blocks=8000,
        wan_gbps=wan_gbps,
        **overrides,  # type: ignore[arg-type]
    )


def test_moving_users_change_region_and_stay_where_they_moved() -> None:
    still, moving = _moving(0.0), _moving(0.6)
    assert [r.prompt for r in still.requests] == [r.prompt for r in moving.requests]
    assert "moves" not in still.params["derived"]
    assert moving.params["derived"]["moves"] > 10
    last: dict[int | None, int] = {}
    changes = 0
    for request in still.requests:  # without moves, a conversation keeps its region
        group = request.prefix_group
        assert last.setdefault(group, request.client_region) == request.client_region
    for request in moving.requests:
        group = request.prefix_group
        changes += group in last and last[group] != request.client_region
        last[group] = request.client_region
    assert changes == moving.params["derived"]["moves"]


def test_without_a_wan_bandwidth_nothing_is_priced_or_replayed() -> None:
    run = simulate(_moving(), "firstlight", _cluster(None), seed=1)
    assert run.warm == ()


def test_a_fork_taking_the_runs_own_way_reproduces_the_run() -> None:
    workload, cluster = _moving(), _cluster(40.0)
    run = _Run(workload, "firstlight", cluster, 1, block_hashes(workload, cluster))
    run.replay_all = True
    result = run.run(0.0)
    assert len(result.warm) >= 5
    ttft = {
        o.request_id: (o.first_token_s - o.arrival_s) * 1000.0
        for o in result.outcomes
        if o.first_token_s is not None
    }
    for record in result.warm:
        assert record.measured_ms is not None
        replayed = record.measured_ms[("recompute", "forward", "pull").index(record.choice)]
        assert replayed == pytest.approx(ttft[record.request_id], abs=1e-6)


def test_the_run_measures_its_own_way_and_forks_the_other_two() -> None:
    run = simulate(_moving(), "firstlight", _cluster(40.0), seed=1)
    assert run.warm
    for record in run.warm:
        assert record.measured_ms is not None
        assert all(ms is not None and ms > 0 for ms in record.measured_ms)
    metrics = warm_metrics(run.warm)
    assert metrics["requests"] == len(run.warm) == metrics["replayed"]
    assert sum(metrics["chosen"].values()) == len(run.warm)


def test_a_fast_link_pulls_and_the_pulled_prefix_is_a_hit_a_slow_one_never_pulls() -> None:
    workload = _moving()
    no_replays = {"hindsight_share": 0.001}
    fast = simulate(workload, "firstlight", _cluster(10_000.0, **no_replays), seed=1)
    slow = simulate(workload, "firstlight", _cluster(0.01, **no_replays), seed=1)
    pulled = [r for r in fast.warm if r.choice == "pull"]
    assert pulled
    assert not [r for r in slow.warm if r.choice == "pull"]
    outcomes = {o.request_id: o for o in fast.outcomes}
    for record in pulled:
        outcome = outcomes[record.request_id]
        assert outcome.served_region == outcome.client_region  # served where it came from
        assert outcome.cached_tokens >= record.pull_bytes // 131_072  # the pull landed


def test_replays_are_sampled_by_request_id_alike_at_every_share() -> None:
    workload = _moving()
    half = simulate(workload, "firstlight", _cluster(40.0, hindsight_share=0.5), seed=1)
    replayed = {r.request_id for r in half.warm if r.measured_ms is not None}
    assert 0 < len(replayed) < len(half.warm)
    every = simulate(workload, "firstlight", _cluster(40.0), seed=1)
    assert {r.request_id for r in half.warm} == {r.request_id for r in every.warm}
    hashed = {r.request_id for r in half.warm if zlib.crc32(r.request_id.encode()) < 2**31}
    assert replayed == hashed


@pytest.mark.parametrize(
    ("field", "value"), [("wan_gbps", 0.0), ("wan_gbps", float("nan")), ("hindsight_share", 0.0)]
)
def test_bad_warm_settings_are_config_errors(field: str, value: float) -> None:
    cluster = _cluster(40.0, **{field: value}) if field != "wan_gbps" else _cluster(value)
    with pytest.raises(ConfigError) as error:
        simulate(_moving(requests=20), "firstlight", cluster, seed=1)
    assert [p.path for p in error.value.problems] == [field]


def _record(choice: str, measured: tuple[float | None, ...]) -> WarmRecord:
    return WarmRecord("q", choice, (1.0, 2.0, 3.0), 100, measured)  # type: ignore[arg-type]


def test_the_choice_counts_only_where_the_ways_differ_and_best_is_within_ten_percent() -> None:
    records = [
        _record("recompute", (100.0, 200.0, 300.0)),  # differ; best
        _record("forward", (100.0, 105.0, 300.0)),  # differ; within 10 % of best
        _record("pull", (100.0, 200.0, 300.0)),  # differ; not best
        _record("pull", (100.0, 101.0, 102.0)),  # do not differ: not counted
        _record("forward", (100.0, None, 90.0)),  # one way lost it: differ; lost = not best
    ]
    metrics = warm_metrics(records)
    assert (metrics["replayed"], metrics["differing"]) == (5, 4)
    assert metrics["best_share"] == 0.5
    assert metrics["best_way"] == {"recompute": 3, "forward": 0, "pull": 1}
    assert metrics["pulled_bytes"] == 200
    table = "\n".join(warm_table([{"load": 0.5, "warm": metrics}], 40.0))
    assert "| 0.5 | 5 | 1 / 2 / 2 | 0.0 | 5 | 4 | 50% |" in table
