"""The soak run: its report and command, then a short soak against a real local platform
of two regions of ``sim`` replicas (the ten-minute run is the same code). Its load, the
closed loop, is tested in ``test_closed_loop.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from firstlight.config import PlatformConfig
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight_bench.tools.soak import SoakReport, soak
from tests.bench.bench_cli import run_bench
from tests.serve.cluster import platform_config, sim_model

MODEL = "sim-soak-test"


def test_the_report_measures_growth_from_the_first_sample_under_load() -> None:
    report = SoakReport(600.0, 3, requests=10, rss_mib={"east/gateway#1": [200.0, 210.0, 220.0]})
    report.tasks_idle_before, report.tasks_idle_after = {"east": 12}, {"east": 12}
    report.tasks_under_load = {"east": [20, 18]}
    assert report.growth_pct("east/gateway#1") == pytest.approx(10.0)
    table = report.markdown()
    assert "| east/gateway#1 | 200 | 220 | +10.0 % |" in table
    assert "| east | 12 | 18 to 20 | 12 |" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0"], "--minutes: 0: must be more than 0"),
        (["--clients", "0"], "'--clients'"),
        (["--sample-s", "-1"], "--sample-s: -1: must be more than 0"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    result = run_bench("soak", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize(("lost", "status"), [(0, 0), (1, 1)])
def test_the_exit_status_says_whether_a_request_was_lost(
    lost: int, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command around :func:`soak`, with the platform and the load replaced."""
    import ray

    from firstlight.serve import local_mode

    deployed: list[str] = []
    running = LocalPlatform(PlatformConfig(), {"soak-east": "http://east.test"}, False, "off")
    monkeypatch.setattr(local_mode, "start_local", lambda config, **_: running)
    monkeypatch.setattr(local_mode, "stop_local", lambda p: deployed.append("stopped"))
    monkeypatch.setattr(ray, "shutdown", lambda: deployed.append("ray down"))

    async def fake_soak(*args: Any, **kwargs: Any) -> SoakReport:
        return SoakReport(60.0, kwargs["clients"], requests=10, lost=lost)

    monkeypatch.setattr("firstlight_bench.tools.soak.soak", fake_soak)
    result = run_bench("soak", "--minutes", "1", "--clients", "2", "--no-tracemalloc")
    assert result.exit_code == status, result.output
    assert deployed == ["stopped", "ray down"]
    assert "2 closed-loop clients per region" in result.stdout
    assert f"10 requests, {lost} lost" in result.stdout


@pytest.fixture(scope="module")
def platform(serve_port: int) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [
            {"name": "soakt-east", "peers": [{"region": "soakt-west", "rtt_ms": 10}]},
            {"name": "soakt-west", "peers": [{"region": "soakt-east", "rtt_ms": 10}]},
        ],
        [sim_model(MODEL, replicas=1)],
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


@pytest.mark.slow
async def test_a_short_soak_finds_every_process_and_loses_nothing(platform: LocalPlatform) -> None:
    lines: list[str] = []
    report = await soak(platform.endpoints, MODEL, 8.0, clients=2, sample_s=3.0,
                        warmup_s=2.0, report=lines.append)  # fmt: skip
    assert report.requests > 10
    assert report.lost == 0, report.problems
    deployments = {p.split("#")[0] for p in report.rss_mib}
    assert deployments == {
        f"{region}/{d}" for region in platform.endpoints for d in ("gateway", f"model-{MODEL}")
    }
    assert all(len(s) >= 2 and min(s) > 10 for s in report.rss_mib.values())
    assert set(report.tasks_idle_before) == set(report.tasks_idle_after) == set(platform.endpoints)
    assert all(count > 0 for count in report.tasks_idle_before.values())
    assert set(report.hint_blocks) == set(platform.endpoints)
    assert max(max(blocks) for blocks in report.hint_blocks.values()) > 0, "hints flowed"
    assert len(lines) >= 2
    print("\n" + report.markdown())
