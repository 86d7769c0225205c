"""``firstlight bench live``'s runner: the policy switched through the config per arm, the
same trace replayed against a freshly deployed local platform each time, one report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError
from firstlight_bench.clients.live import run_live_arms, with_policy
from firstlight_bench.reports.results import validate_results
from tests.serve.cluster import platform_config, sim_model

MODEL = "sim-live"
EAST, WEST = "live-east", "live-west"
REGIONS = [
    {"name": EAST, "peers": [{"region": WEST, "rtt_ms": 30}]},
    {"name": WEST, "peers": [{"region": EAST, "rtt_ms": 30}]},
]


def _config(port: int, **router: object) -> PlatformConfig:
    model = sim_model(MODEL)
    extra = {"router": router} if router else None
    return platform_config(port, REGIONS, [model], extra=extra)


def _small_w1(port: int, out: Path, arms: list[str], **kwargs: Any) -> dict[str, Any]:
    """Twelve short W1 requests at 10 req/s per seed through ``arms`` on a fresh local
    platform; the stored ``results.json``, validated."""
    paths = run_live_arms(
        config=_config(port),
        arms=arms,
        workload="W1",
        rate_rps=10.0,
        requests=12,
        out=out,
        params={"groups": 2, "system_tokens": 96, "question_tokens": 8, "output_tokens": 4},
        timeout_s=60.0,
        startup_timeout_s=120.0,
        **kwargs,
    )
    data: dict[str, Any] = json.loads(paths["results"].read_text())
    validate_results(data)
    return data


def test_with_policy_switches_the_policy_and_drops_foreign_params() -> None:
    config = _config(8000, policy="firstlight", params={"affinity_weight": 2.0})
    baseline = with_policy(config, "round_robin")
    assert (baseline.router.policy, dict(baseline.router.params)) == ("round_robin", {})
    same = with_policy(config, "firstlight")
    assert dict(same.router.params) == {"affinity_weight": 2.0}
    assert baseline.models == config.models
    assert baseline.regions == config.regions


def test_the_region_local_arm_is_firstlight_that_never_spills_over() -> None:
    config = _config(8000, policy="firstlight", params={"affinity_weight": 2.0})
    local = with_policy(config, "firstlight_local")
    assert (local.router.policy, local.router.spill_over) == ("firstlight", False)
    assert dict(local.router.params) == {"affinity_weight": 2.0}
    assert with_policy(config, "firstlight").router.spill_over is True


def test_a_simulator_only_arm_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="gorgo") as caught:
        run_live_arms(
            config=_config(8000),
            arms=["firstlight", "gorgo"],
            workload="W1",
            seeds=[0],
            rate_rps=1.0,
            requests=2,
            out=tmp_path,
        )
    assert caught.value.problems[0].path == "arms"
    assert not any(tmp_path.iterdir())


def test_the_waterfall_arm_needs_a_capacity_and_never_spills(tmp_path: Path) -> None:
    config = _config(8000, policy="firstlight", params={"affinity_weight": 2.0})
    waterfall = with_policy(config, "waterfall")
    assert (waterfall.router.policy, waterfall.router.spill_over) == ("llmd_sticky", False)
    assert dict(waterfall.router.params) == {}
    with pytest.raises(ConfigError) as caught:
        run_live_arms(
            config=config,
            arms=["waterfall"],
            workload="W1",
            seeds=[0],
            rate_rps=1.0,
            requests=2,
            out=tmp_path,
        )
    assert caught.value.problems[0].path == "replica_capacity_rps"
    assert not any(tmp_path.iterdir())


def test_two_arms_against_a_local_platform(serve_port: int, tmp_path: Path) -> None:
    lines: list[str] = []
    data = _small_w1(
        serve_port, tmp_path / "live", ["round_robin", "firstlight"], seeds=[0],
        report=lines.append,
    )  # fmt: skip
    assert [(p["arm"], p["load"]) for p in data["points"]] == [
        ("firstlight", 10.0),
        ("round_robin", 10.0),
    ]
    for point in data["points"]:
        assert (point["completed"], point["errors"]) == (12, 0), point
        assert point["ttft_ms"]["p50"] is not None
    meta = data["meta"]
    assert meta["simulated"] is True  # sim engines: labelled so
    assert meta["config"]["arms"] == ["round_robin", "firstlight"]
    assert meta["config"]["platform"]["router"]["policy"] == "firstlight"  # the base config
    assert meta["workload"]["requests"] == 12
    # Each arm was deployed, replayed and reported in turn.
    assert next(line for line in lines if "deploying" in line).startswith("seed 0 round_robin:")
    assert any(line.startswith("seed 0 firstlight: 12 completed, 0 errors") for line in lines)


def test_the_waterfall_overflows_across_regions_on_every_seed(
    serve_port: int, tmp_path: Path
) -> None:
    """W1 at 10 req/s from both regions' clients against a capacity of 2 req/s per
    replica: the driver's global load balancer sends each region's excess to the other,
    where the regions themselves would never send it (spill-over off). One point per
    seed."""
    data = _small_w1(
        serve_port, tmp_path / "live", ["waterfall"], seeds=[0, 1], replica_capacity_rps=2.0
    )
    assert [(p["arm"], p["seed"]) for p in data["points"]] == [("waterfall", 0), ("waterfall", 1)]
    for point in data["points"]:
        assert (point["completed"], point["errors"]) == (12, 0), point
        assert point["cross_region_share"] > 0, point
    config = data["meta"]["config"]
    assert (config["seeds"], config["replica_capacity_rps"]) == ([0, 1], 2.0)
    assert config["platform"]["router"]["spill_over"] is True  # the base config, as given
