"""``firstlight bench live``'s runner: the policy switched through the config per arm, the
same trace replayed against a freshly deployed local platform each time, one report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError
from firstlight_bench.live import run_live_arms, with_policy
from firstlight_bench.results import validate_results
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
            seed=0,
            rate_rps=1.0,
            requests=2,
            out=tmp_path,
        )
    assert caught.value.problems[0].path == "arms"
    assert not any(tmp_path.iterdir())


def test_two_arms_against_a_local_platform(serve_port: int, tmp_path: Path) -> None:
    lines: list[str] = []
    paths = run_live_arms(
        config=_config(serve_port),
        arms=["round_robin", "firstlight"],
        workload="W1",
        seed=0,
        rate_rps=10.0,
        requests=12,
        out=tmp_path / "live",
        params={"groups": 2, "system_tokens": 96, "question_tokens": 8, "output_tokens": 4},
        timeout_s=60.0,
        startup_timeout_s=120.0,
        report=lines.append,
    )
    data = json.loads(paths["results"].read_text())
    validate_results(data)
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
    assert next(line for line in lines if "deploying" in line).startswith("round_robin:")
    assert any(line.startswith("firstlight: 12 completed, 0 errors") for line in lines)
