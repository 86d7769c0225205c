"""The KV offload study (``firstlight_bench.tools.offload``): its arms, its report, and the
stored run docs/routing.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight.engine.sim import get_profile
from firstlight_bench.tools.offload import (
    ARMS,
    OFFLOAD_BEGIN,
    OFFLOAD_END,
    OffloadStudy,
    arm_cluster,
    render,
    run_study,
    summarize,
)
from tests.bench.bench_cli import run_bench

REPO = Path(__file__).resolve().parents[2]
SMALL = OffloadStudy(
    requests=300, rates_rps=(10.0,), replicas=2, kv_blocks=200, host_blocks=2000, seeds=(0,)
)


def test_each_arm_is_the_firstlight_policy_with_its_view_of_the_host_tier() -> None:
    reload = get_profile("h100-llama-8b").reload_ms_per_token
    clusters = {arm: arm_cluster(SMALL, arm, 128.0) for arm in ARMS}
    params = {arm: c.policy_params["firstlight"] for arm, c in clusters.items()}
    assert params["host-credited"]["reload_ms_per_token"] == pytest.approx(reload)
    assert params["host-as-miss"]["host_tier"] is False
    assert params["host-free"]["reload_ms_per_token"] == 0.0
    assert "reload_ms_per_token" not in params["no-host-tier"]
    assert {arm: c.build_profile().host_kv_blocks for arm, c in clusters.items()} == {
        "host-credited": 2000,
        "host-as-miss": 2000,
        "host-free": 2000,
        "no-host-tier": 0,
    }
    assert all(c.build_profile().kv_cache_blocks == 200 for c in clusters.values())
    with pytest.raises(ValueError, match="arm"):
        arm_cluster(SMALL, "firstlight", 128.0)


def test_a_small_study_is_deterministic_and_the_host_tier_adds_hits() -> None:
    points = run_study(SMALL, progress=lambda line: None)
    assert points == run_study(SMALL, progress=lambda line: None)
    assert [p["arm"] for p in points] == list(ARMS)
    by_arm = {p["arm"]: p for p in points}
    for p in points:
        assert p["completed"] == 300
        assert p["ttft_p50_ms"] <= p["ttft_p95_ms"] <= p["ttft_p99_ms"]
    assert by_arm["host-free"]["hit_rate"] > by_arm["no-host-tier"]["hit_rate"]


def test_the_summary_and_the_table() -> None:
    points = [
        {"rate_rps": 10.0, "arm": arm, "seed": seed, "completed": 10,
         "ttft_p50_ms": 10.0 + seed, "ttft_p95_ms": 20.0 + i, "ttft_p99_ms": 30.0 + 2 * seed,
         "hit_rate": 0.5}
        for i, arm in enumerate(ARMS)
        for seed in (0, 1, 2)
    ]  # fmt: skip
    rows = summarize(points)
    assert [r["arm"] for r in rows] == list(ARMS)
    first = rows[0]
    assert (first["ttft_p50_ms"], first["ttft_p50_range_ms"]) == (11.0, [10.0, 12.0])
    assert (first["ttft_p99_ms"], first["ttft_p99_range_ms"]) == (32.0, [30.0, 34.0])
    report = {
        "git_commit": "a" * 40,
        "command": "firstlight bench offload",
        "study": _study_dict(),
        "reload_ms_per_token": 0.0052,
        "summary": rows,
    }
    text = render(report)
    assert "reload 5.20 µs per token (stated, not measured)" in text
    assert "| 10 | `host-as-miss` | 11.0 (10.0 to 12.0) | 21.0 (21.0 to 21.0) |" in text


def _study_dict() -> dict[str, object]:
    return {
        "workload": "W2",
        "requests": 10,
        "rates_rps": [10.0],
        "replicas": 2,
        "profile": "h100-llama-8b",
        "kv_blocks": 200,
        "host_blocks": 2000,
        "seeds": [0, 1, 2],
    }


def test_the_routing_page_shows_the_stored_run() -> None:
    stored = json.loads((REPO / "docs/benchmarks/offload-sim/results.json").read_text())
    assert render(stored) in (REPO / "docs/routing.md").read_text(), (
        "docs/routing.md is stale: firstlight bench offload --tables-only "
        "--out docs/benchmarks/offload-sim --page docs/routing.md"
    )
    assert stored["simulated"] is True
    assert len(stored["study"]["seeds"]) >= 3
    rows = {(r["rate_rps"], r["arm"]): r for r in stored["summary"]}
    lightest = min(stored["study"]["rates_rps"])
    credited, unseen = rows[lightest, "host-credited"], rows[lightest, "host-as-miss"]
    # What the page claims: below saturation, crediting host hits beats pricing them as
    # misses, at the median and in the tail.
    for name in ("p50", "p95", "p99"):
        assert credited[f"ttft_{name}_ms"] < unseen[f"ttft_{name}_ms"]
    assert credited["hit_rate"] > unseen["hit_rate"]


def test_tables_only_rewrites_the_page_from_the_stored_run(tmp_path: Path) -> None:
    page = tmp_path / "routing.md"
    page.write_text(f"before\n{OFFLOAD_BEGIN}\nold\n{OFFLOAD_END}\nafter\n")
    stored = REPO / "docs/benchmarks/offload-sim"
    result = run_bench("offload", "--tables-only", "--out", str(stored), "--page", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads((stored / "results.json").read_text())
    assert page.read_text() == f"before\n{render(report)}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "'--requests'"),
        (["--kv-blocks", "0"], "'--kv-blocks'"),
        (["--host-blocks", "0"], "'--host-blocks'"),
        (["--replicas", "0"], "'--replicas'"),
        (["--seeds", "1", "--seeds", "1"], "--seeds: [1, 1]: repeated"),
        (["--rates", "fast"], "'--rates'"),
        (["--tables-only", "--page", "x.md"], "--tables-only needs --out"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("offload", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
