"""The serving benchmark's pure helpers (statistics, comparisons, report) on known
inputs; nothing here starts Ray."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from firstlight_bench.reports.serving_markdown import hops, markers, plot_hops, render_markdown
from firstlight_bench.reports.serving_report import (
    added_latency,
    capacity,
    phase,
    render,
    summarize,
    target,
    throughput,
)
from firstlight_bench.tools.serving import bench_config
from firstlight_bench.tools.serving_paths import MODEL, REGION
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]


def _row(gateways: int, block: int, concurrency: int, per_s: float, cores: float) -> dict[str, Any]:
    """A capacity row as :func:`~firstlight_bench.tools.serving_gateways.capacity_block` makes
    it: ``per_s`` requests/s over 1 s, ``cores`` split between gateways and clients."""
    row = throughput([10.0] * int(per_s), 1.0, 0, concurrency)
    split = {"gateways": cores / 2, "clients": cores / 2}
    return {"gateways": gateways, "block": block, **row, "cores": split}


def test_capacity_compares_each_counts_best_level_averaged_over_blocks() -> None:
    rows = [
        _row(1, 0, 1, 40, 1.0),
        _row(1, 0, 8, 100, 1.9),
        _row(2, 1, 1, 40, 1.0),
        _row(2, 1, 8, 150, 2.0),
        _row(2, 2, 1, 40, 1.0),
        _row(2, 2, 8, 130, 2.0),
        _row(1, 3, 1, 40, 1.0),
        _row(1, 3, 8, 120, 1.9),
    ]
    cap = capacity(rows)
    assert cap["by_gateways"]["1"]["requests_per_s"] == 110.0
    assert cap["by_gateways"]["1"]["at_concurrency"] == 8
    assert cap["by_gateways"]["2"]["requests_per_s"] == 140.0
    assert cap["by_gateways"]["2"]["cores_total"] == 2.0
    assert cap["by_gateways"]["2"]["cores"] == {"gateways": 1.0, "clients": 1.0}
    assert cap["scaling"] == {"gateways": [1, 2], "ratio": 1.273, "goal": 1.7, "met": False}
    doubled = capacity([_row(1, 0, 8, 100, 1.0), _row(2, 1, 8, 170, 2.0)])
    assert doubled["scaling"]["met"] is True  # the goal is inclusive


def test_summarize_uses_the_projects_one_percentile() -> None:
    stats = summarize([float(i) for i in range(1, 101)])
    assert (stats["p50"], stats["p90"], stats["p99"]) == (50.5, 90.1, 99.01)


def test_summarize_of_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="quantile"):
        summarize([])


def test_summarize_rounds_to_microseconds() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 10.0004])
    assert stats == {"n": 5, "p50": 3.0, "p90": 7.6, "p99": 9.76, "mean": 4.0}


def test_phase_splits_ttft_and_end_to_end() -> None:
    summary = phase([(1.0, 10.0), (3.0, 30.0)])
    assert summary["ttft_ms"]["p50"] == 2.0
    assert summary["e2e_ms"]["p50"] == 20.0


def test_added_latency_subtracts_percentiles_per_metric() -> None:
    direct = phase([(0.2, 0.5)] * 10)
    platform = phase([(2.0, 4.0)] * 9 + [(12.2, 20.5)])
    added = added_latency(direct, platform)
    # p99 of ten samples sits 0.91 of the way from the 9th to the 10th:
    # 2.0 + 0.91 x 10.2 = 11.282 and 4.0 + 0.91 x 16.5 = 19.015.
    assert added == {
        "ttft_ms": {"p50": 1.8, "p99": pytest.approx(11.282 - 0.2)},
        "e2e_ms": {"p50": 3.5, "p99": pytest.approx(19.015 - 0.5)},
    }


@pytest.mark.parametrize(
    ("ttft", "e2e", "ttft_met", "e2e_met"), [(3.0, 3.001, True, False), (3.01, 1.0, False, True)]
)
def test_target_is_met_at_three_ms_inclusive(
    ttft: float, e2e: float, ttft_met: bool, e2e_met: bool
) -> None:
    added = {"ttft_ms": {"p50": ttft, "p99": 9.0}, "e2e_ms": {"p50": e2e, "p99": 9.0}}
    verdict = target(added)
    assert (verdict["ttft_met"], verdict["e2e_met"]) == (ttft_met, e2e_met)
    assert verdict["ttft_added_p50_ms"] == ttft


def test_throughput_counts_completed_requests_per_second() -> None:
    row = throughput([10.0, 20.0, 30.0, 40.0], elapsed_s=2.0, errors=1, concurrency=8)
    assert row["requests"] == 4
    assert row["requests_per_s"] == 2.0
    assert row["p50_ms"] == 25.0
    assert row["errors"] == 1
    empty = throughput([], elapsed_s=1.0, errors=3, concurrency=1)
    assert empty["requests_per_s"] == 0.0
    assert math.isnan(empty["p50_ms"])


def test_render_shows_every_path_comparison_and_an_honest_verdict() -> None:
    paths = {name: phase([(1.0, 2.0)]) for name in ("direct", "http_tokens")}
    added = {"http_tokens - direct": added_latency(paths["direct"], paths["http_tokens"])}
    report: dict[str, Any] = {
        "simulated_engine": True,
        "meta": {
            "cpu_count": 2,
            "platform": "Linux",
            "python": "3.11",
            "ray": "2.60.0",
            "serve_throughput_optimized": "0",
            "hints": "hints: off",
            "warm_up": 20,
            "options": {"requests": 1, "prompt_tokens": 128, "max_tokens": 8, "duration": 1.0},
        },
        "overhead": {
            "paths": paths,
            "added_ms": added,
            "target": target({"ttft_ms": {"p50": 23.2}, "e2e_ms": {"p50": 1.0}}),
        },
        "throughput": [_row(1, 0, 1, 5, 1.0), _row(2, 1, 1, 5, 1.0)],
        "kills": [
            {
                "client": "httpx",
                "gateways": 2,
                "requests": 200,
                "lost": 1,
                "lost_in_flight": 1,
                "served_after_kill": 120,
                "problems": ["no [DONE]"],
            }
        ],
    }
    report["capacity"] = capacity(report["throughput"])
    text = render(report)
    assert "SIMULATED ENGINE" in text
    assert "http_tokens - direct" in text
    assert "TTFT +23.200 ms NOT MET" in text
    assert "e2e +1.000 ms MET" in text
    assert "scaling 2 over 1 gateways: x1.00 (goal >= 1.7) NOT MET" in text
    assert "httpx clients: 200 requests, 1 failed (1 in flight at the kill), 120 served" in text


def test_the_generated_section_says_where_it_came_from_and_whether_the_goal_held() -> None:
    paths = {
        name: phase([(float(i), float(i) + 1.0)])
        for i, name in enumerate(("direct", "handle", "ray_serve_floor", "http_tokens"), 1)
    }
    added = {
        f"{o} - {b}": added_latency(paths[b], paths[o])
        for o, b in (("http_tokens", "direct"), ("http_tokens", "ray_serve_floor"))
    }
    report: dict[str, Any] = {
        "meta": {
            "command": "firstlight bench serving --out docs/benchmarks/x",
            "git_commit": "0123456789abcdef0123",
            "ingress": "haproxy",
            "serve_throughput_optimized": "1",
            "cpu_count": 2,
            "ray": "2.60.0",
            "warm_up": 20,
            "options": {"requests": 5, "prompt_tokens": 128, "max_tokens": 8, "duration": 1.0},
        },
        "overhead": {
            "paths": paths,
            "added_ms": added,
            "target": target(added["http_tokens - direct"]),
        },
        "throughput": [_row(1, 0, 8, 100, 1.5), _row(2, 1, 8, 180, 2.0), _row(1, 2, 8, 80, 1.5)],
        "kills": [
            {
                "client": client,
                "gateways": 2,
                "clients": 4,
                "max_tokens": 16,
                "requests": 300,
                "lost": lost,
                "lost_in_flight": lost,
                "served_after_kill": 150,
                "replaced_after_s": 3.25,
                "problems": ["RemoteProtocolError: Server disconnected"] if lost else [],
            }
            for client, lost in (("httpx", 2), ("openai", 0))
        ],
    }
    report["capacity"] = capacity(report["throughput"])
    begin, end = markers("x")
    section = render_markdown(report, "x")
    assert section.startswith(begin + "\n")
    assert section.endswith("\n" + end)
    assert "`firstlight bench serving --out docs/benchmarks/x` at commit `0123456789ab`" in section
    assert "ingress `haproxy`, throughput-optimized data plane on" in section
    assert "| **Firstlight**, `/v1/completions` with token ids, streamed | 4.00 |" in section
    assert (
        "TTFT added over the engine: p50 +3.00 ms (goal ≤ 5: met), p99 +3.00 ms "
        "(goal ≤ 15: met)." in section  # 4 - 1
    )
    assert (
        "Firstlight over the bare Ray Serve app: p50 +1.00 ms, p99 +1.00 ms "
        "(goal: below it: **missed**)." in section
    )
    # 90 requests/s with 0.75 gateway cores at one gateway's best level (blocks averaged)
    assert "One gateway's requests/s per core it used: 120 (goal ≥ 384: **missed**)." in section
    assert "| 1 | 8 | 90.0 | 10.0 | 10.0 | 0 | 1.50 |" in section  # two blocks, averaged
    assert "| 2 | 8 | 180.0 | 10.0 | 10.0 | 0 | 2.00 |" in section
    assert "| gateways | requests/s | gateways | clients | total |" in section
    assert "| 2 | 180.0 | 1.00 | 1.00 | 2.00 |" in section
    assert "Capacity with 2 gateways ÷ with 1: x2.00 (goal ≥ 1.7: met)." in section
    assert "| plain HTTP (httpx), no retries | 300 | 2 | 2 | 150 | 3.2 s |" in section
    assert (
        "- plain HTTP (httpx), no retries: `RemoteProtocolError: Server disconnected`." in section
    )
    assert "| the official `openai` client, its default retries (2) | 300 | 0 | 0 |" in section
    assert "killed, official client (goal 0): 0 (met)." in section


def test_the_serving_page_shows_exactly_the_stored_reports() -> None:
    page = (REPO / "docs" / "serving.md").read_text()
    names = re.findall(r"<!-- serving:([\w-]+):begin", page)
    assert names == ["serving-haproxy", "serving-serve-proxy"]
    commits = set()
    for name in names:
        report = json.loads((REPO / "docs" / "benchmarks" / name / "results.json").read_text())
        begin, end = markers(name)
        shown = shown_section(page, begin, end)
        assert shown == render_markdown(report, name), f"{name}: rerun the command it names"
        assert not report["meta"]["git_commit"].endswith("-dirty")
        commits.add(report["meta"]["git_commit"])
    assert len(commits) == 1, "the compared runs must come from one commit"


def test_bench_config_is_one_local_instant_region() -> None:
    config = bench_config(18000, 4000, "abc")
    assert config.mode == "local"
    assert [r.name for r in config.regions] == [REGION]
    (model,) = config.models
    assert (model.name, model.engine, model.sim_profile, model.replicas) == (
        MODEL,
        "sim",
        "instant",
        2,
    )
    assert model.resources.num_cpus == 0
    assert model.max_model_len >= 4000 + 8
    assert not config.auth.enabled
    assert config.hints.key_prefix == "flbench:abc:"
    assert config.gateway.port == 18000


def test_one_gateway_count_or_no_throughput_gives_no_scaling_verdict() -> None:
    assert capacity([_row(2, 0, 8, 100, 1.0), _row(2, 1, 8, 120, 1.0)])["scaling"] is None
    assert capacity([_row(1, 0, 8, 0, 1.0), _row(2, 1, 8, 120, 1.0)])["scaling"] is None


def test_a_kill_that_did_not_run_is_shown_and_not_judged() -> None:
    report = json.loads(
        (REPO / "docs" / "benchmarks" / "serving-haproxy" / "results.json").read_text()
    )
    report["throughput"] = [_row(2, 0, 8, 100, 1.0)]
    report["capacity"] = capacity(report["throughput"])
    report["kills"] = [{"client": "openai", "error": "TimeoutError: gateways never all answered"}]
    section = render_markdown(report, "x")
    assert "Capacity with" not in section
    assert "- the official `openai` client, its default retries (2): did not run" in section
    assert "not judged (no official-client run)" in section


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gateways", "one,two"], "Invalid value for --gateways: 'one,two'"),
        (["--concurrency", "8,x"], "Invalid value for --concurrency: '8,x'"),
        (["--gateways", "0"], "Invalid value for --gateways: '0'"),
        (["--gateways", "1", "--kill", "on"], "--gateways: --kill on needs a count >= 2"),
        (["--requests", "1"], "'--requests'"),
        (["--prompt-tokens", "31"], "'--prompt-tokens'"),
        (["--kill", "maybe"], "'--kill'"),
        (["--ingress", "nginx"], "'--ingress'"),
        (["--throughput-optimized", "yes"], "'--throughput-optimized'"),
        (["--page", "p.md"], "--page needs --out"),
        (["--tables-only"], "--tables-only needs --page"),
    ],
)
def test_bad_options_are_refused_by_name_before_anything_starts(
    argv: list[str], message: str
) -> None:
    result = run_bench("serving", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_tables_only_rewrites_every_section_from_the_reports_beside_the_page(
    tmp_path: Path,
) -> None:
    stored = json.loads(
        (REPO / "docs" / "benchmarks" / "serving-haproxy" / "results.json").read_text()
    )
    (tmp_path / "benchmarks" / "serving-x").mkdir(parents=True)
    (tmp_path / "benchmarks" / "serving-x" / "results.json").write_text(json.dumps(stored))
    begin, end = markers("serving-x")
    page = tmp_path / "serving.md"
    page.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    result = run_bench("serving", "--tables-only", "--page", str(page))
    assert result.exit_code == 0, result.output
    assert page.read_text() == f"before\n{render_markdown(stored, 'serving-x')}\nafter\n"
    assert (tmp_path / "benchmarks" / "serving-x" / "hops.png").read_bytes()[:4] == b"\x89PNG"


def test_the_ttft_is_split_by_hop_and_drawn(tmp_path: Path) -> None:
    p50s = {"direct": 0.5, "port": 1.5, "http_floor": 2.0, "http_tokens": 6.0}
    paths = {name: phase([(ms, ms + 1.0)]) for name, ms in p50s.items()}
    report: dict[str, Any] = {
        "meta": {"ingress": "haproxy"},
        "overhead": {"paths": paths, "decision_mean_us": 150.0},
    }
    assert hops(report) == [
        ("engine (in process)", 0.5),
        ("replica port hop", 1.0),
        ("ingress + gateway HTTP (`GET /healthz`)", 2.0),
        ("gateway's own work (auth, validation, tokenizing, hashes, decision, SSE)", 2.5),
        ("of which the routing decision (mean)", 0.15),
    ]
    plot_hops(report, tmp_path / "hops.png")
    assert (tmp_path / "hops.png").read_bytes().startswith(b"\x89PNG")
    del paths["port"]  # a report from before the port path: no split, no picture
    assert hops(report) is None
    plot_hops(report, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
