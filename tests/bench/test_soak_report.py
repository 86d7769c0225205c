"""The soak run's stored record and its markdown (``firstlight_bench.reports.soak_report``), its
sampling schedule and options, and how it reaches every gateway of a region through a
handle that picks one (``firstlight_bench.tools.soak_memory.each_gateway``) — all without Ray."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from firstlight.telemetry.memory import MemoryGrowth, MemoryOwner
from firstlight_bench.reports.soak_report import (
    SOAK_BEGIN,
    SOAK_END,
    gateway_rows,
    render,
    rewrite_page,
    write_run,
)
from firstlight_bench.tools.soak import SoakReport, sample_times
from firstlight_bench.tools.soak_memory import each_gateway
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
EAST_GW = "soak-east/gateway#101"
WEST_GW = "soak-west/gateway#202"
EAST_MODEL = "soak-east/model-sim-soak#303"


def _growth(pid: int, owners: list[tuple[str, float]], other_mib: float) -> dict[str, Any]:
    listed = tuple(
        MemoryOwner(name, int(mib * MIB), 10, f"{name}:1", int(mib * MIB)) for name, mib in owners
    )
    grown = MemoryGrowth(
        pid=pid,
        baseline="warm-up end",
        label="end",
        frames=4,
        traced_growth_bytes=sum(o.size_bytes for o in listed) + int(other_mib * MIB),
        tracemalloc_growth_bytes=int(0.5 * MIB),
        owners=listed,
        other_bytes=int(other_mib * MIB),
    )
    return asdict(grown)


def _run() -> dict[str, Any]:
    """A 60-minute run as ``firstlight bench soak`` stores it (through JSON, as the file
    holds it)."""
    report = SoakReport(3600.0, 3, requests=12_345, warmup_s=1200.0, tracemalloc_frames=4)
    report.sample_at_s = [600.0, 1200.0, 2400.0, 3600.0]
    report.rss_mib = {
        EAST_GW: [170.0, 180.0, 182.0, 184.0],
        WEST_GW: [168.0, 176.0, 177.0, 178.0],
        EAST_MODEL: [300.0, 310.0, 311.0, 312.0],
    }
    report.rss_mib_at_warmup = {EAST_GW: 180.0, WEST_GW: 176.0, EAST_MODEL: 310.0}
    report.rss_mib_after_baseline = {EAST_GW: 183.0, WEST_GW: 176.5}
    report.tasks_idle_before = {"soak-east": 6, "soak-west": 6}
    report.tasks_under_load = {"soak-east": [12, 19], "soak-west": [13, 14]}
    report.tasks_idle_after = {"soak-east": 6, "soak-west": 7}
    report.hint_blocks = {"soak-east": [100, 2900, 2800, 2850]}
    report.ttft_ms_first_minute = {"soak-east": 2101.0}
    report.ttft_ms_last_minute = {"soak-east": 2085.0}
    report.traced_mib = {EAST_GW: [(600.0, 10.0), (1200.0, 12.0), (3600.0, 14.5)]}
    report.memory = {
        EAST_GW: _growth(101, [("firstlight.hints.mirror", 1.0), ("ray.serve", 0.5)], 0.25),
        WEST_GW: _growth(202, [("ray.serve", 2.0), ("asyncio", -0.25)], 0.0),
    }
    report.memory_problems = ["soak-west memory_status: soak-west/gateway#203 did not answer"]
    stored = {
        "command": "firstlight bench soak --minutes 60 --out /tmp/soak-60",
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "simulated": True,
        "regions": 2,
        "model_replicas": 2,
        "gateways_per_region": 2,
        "sample_s": 30.0,
        **asdict(report),
    }
    loaded: dict[str, Any] = json.loads(json.dumps(stored))
    return loaded


def test_the_section_states_the_run_and_the_growth_over_the_measured_span() -> None:
    text = render(_run())
    assert text.startswith(SOAK_BEGIN)
    assert text.endswith(SOAK_END)
    assert (
        "Measured at 0123456789ab (`firstlight bench soak --minutes 60 --out /tmp/soak-60`)" in text
    )
    assert "the last 40 minutes" in text
    assert "(20 min)" in text
    assert "12,345 requests: **0 lost**, 0 hung." in text
    # From the end of the warm-up (not the first sample) to the end; per minute over 40.
    assert f"| {EAST_GW} | 180.0 | 184.0 | +2.2 % | +0.100 MiB |" in text
    assert f"| {EAST_MODEL} | 310.0 | 312.0 | +0.6 % | +0.050 MiB |" in text
    assert "| soak-west | 6 | 13 to 14 | 7 |" in text
    assert "* Hint mirror of soak-east: 100 entries at the first sample, 2,900 at most" in text
    assert "* TTFT p99 in soak-east: first minute 2101 ms, last 2085 ms." in text
    assert "* Not measured: soak-west memory_status: soak-west/gateway#203 did not answer." in text


def test_the_rss_growth_is_split_into_traced_tables_snapshot_and_the_rest() -> None:
    run = _run()
    rows = {row[0]: row[1:] for row in gateway_rows(run)}
    # east: RSS +4.0 = traced 1.75 + tracemalloc's tables 0.5 + the baseline snapshot's
    # 3.0 (183 right after it, 180 before) + not explained -1.25.
    assert rows[EAST_GW] == pytest.approx((4.0, 1.75, 0.5, 3.0, -1.25))
    assert rows[WEST_GW] == pytest.approx((2.0, 1.75, 0.5, 0.5, -0.75))
    assert f"| {EAST_GW} | +4.00 | +1.75 | +0.50 | +3.00 | -1.25 |" in render(run)
    del run["rss_mib_after_baseline"][WEST_GW]  # not read: no transient to subtract
    assert dict((row[0], row[1:]) for row in gateway_rows(run))[WEST_GW] == pytest.approx(
        (2.0, 1.75, 0.5, 0.0, -0.25)
    )


def test_the_owners_table_has_a_column_per_gateway_ranked_by_total_growth() -> None:
    text = render(_run())
    lines = text.splitlines()
    start = lines.index(f"| owner | {EAST_GW} | {WEST_GW} | where it grew most |")
    assert lines[start + 2 : start + 8] == [
        "| `ray.serve` | +512 | +2,048 | `ray.serve:1` (+2,048) |",
        "| `firstlight.hints.mirror` | +1,024 | · | `firstlight.hints.mirror:1` (+1,024) |",
        "| `asyncio` | · | -256 | `asyncio:1` (-256) |",
        "| other owners | +256 | +0 | |",
        "| **all traced** | +1,792 | +1,792 | |",
        "",
    ]
    assert "not among that gateway's top 2" in text


def test_an_untraced_run_has_no_memory_tables() -> None:
    run = {**_run(), "memory": {}, "tracemalloc_frames": 0, "memory_problems": []}
    text = render(run)
    assert "did not trace their allocations (`--no-tracemalloc`)" in text
    assert "| owner |" not in text
    assert "not explained |" not in text


def test_the_run_folder_holds_the_record_and_a_report_with_every_sample(tmp_path: Path) -> None:
    run = _run()
    write_run(tmp_path / "soak", run)
    assert json.loads((tmp_path / "soak" / "results.json").read_text()) == run
    report = (tmp_path / "soak" / "report.md").read_text()
    assert render(run) in report
    rss = report[report.index("## RSS per sample") :]
    assert f"| min | {EAST_GW} | {EAST_MODEL} | {WEST_GW} |" in rss
    assert "| 10.0 | 170.0 | 300.0 | 168.0 |" in rss
    assert "| 60.0 | 184.0 | 312.0 | 178.0 |" in rss
    traced = report[report.index("## Traced Python memory") :]
    assert "| 40.0 |  |" in traced  # east did not answer at that sample
    assert "| 60.0 | 14.5 |" in traced


def test_the_page_section_is_rewritten_from_the_stored_run(tmp_path: Path) -> None:
    write_run(tmp_path / "soak", _run())
    page = tmp_path / "reliability.md"
    page.write_text(f"# Title\n\nbefore\n\n{SOAK_BEGIN}\nold text\n{SOAK_END}\n\nafter\n")
    result = run_bench(
        "soak", "--tables-only", "--out", str(tmp_path / "soak"), "--page", str(page)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing run, nothing printed
    assert page.read_text() == f"# Title\n\nbefore\n\n{render(_run())}\n\nafter\n"
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="soak:begin"):
        rewrite_page(page, _run())


def test_the_stored_run_on_the_reliability_page_is_current() -> None:
    stored = REPO / "docs/benchmarks/soak-sim/results.json"
    if not stored.is_file():
        pytest.skip("no soak run stored in docs/benchmarks/soak-sim yet")
    page = (REPO / "docs/reliability.md").read_text()
    section = shown_section(page, SOAK_BEGIN, SOAK_END)
    assert section == render(json.loads(stored.read_text())), (
        "docs/reliability.md is stale: firstlight bench soak --tables-only "
        "--out docs/benchmarks/soak-sim --page docs/reliability.md"
    )


def test_growth_is_measured_from_the_end_of_the_warm_up_when_known() -> None:
    report = SoakReport(600.0, 3, rss_mib={"p": [100.0, 110.0, 121.0]})
    assert report.growth_pct("p") == pytest.approx(21.0)
    report.rss_mib_at_warmup = {"p": 110.0}
    assert report.growth_pct("p") == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("duration_s", "sample_s", "warmup_s", "expected"),
    [
        (10.0, 3.0, 0.0, [0.0, 3.0, 6.0, 9.0]),
        (8.0, 3.0, 2.0, [2.0, 3.0, 6.0]),
        (120.0, 30.0, 40.0, [30.0, 40.0, 60.0, 90.0]),
        (120.0, 30.0, 60.0, [30.0, 60.0, 90.0]),
    ],
)
def test_samples_are_taken_every_interval_and_at_the_end_of_the_warm_up(
    duration_s: float, sample_s: float, warmup_s: float, expected: list[float]
) -> None:
    assert sample_times(duration_s, sample_s, warmup_s) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--minutes", "1", "--warmup-s", "60"],
            "--warmup-s: 60: from 0 to less than the run (60 s)",
        ),
        (["--minutes", "1", "--warmup-s", "-1"], "'--warmup-s'"),
        (["--frames", "0"], "'--frames'"),
        (["--top", "0"], "'--top'"),
        (["--tables-only", "--page", "x.md"], "--tables-only needs --out"),
        (["--page", str(REPO / "README.md")], "Invalid value for --page: "),
    ],
    ids=[
        "warm-up-as-long-as-the-run",
        "negative-warm-up",
        "no-frames",
        "no-owners",
        "tables-without-out",
        "page-without-markers",
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    result = run_bench("soak", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


# --- reaching every gateway through a handle that picks one ------------------------------


@dataclass(frozen=True)
class _Answer:
    pid: int


def _picker(order: list[int | Exception]) -> tuple[Callable[[], Awaitable[_Answer]], list[int]]:
    """An ask that answers from the processes in ``order``, one per call, cycling."""
    calls: list[int] = []

    async def ask() -> _Answer:
        calls.append(1)
        picked = order[(len(calls) - 1) % len(order)]
        if isinstance(picked, Exception):
            raise picked
        return _Answer(picked)

    return ask, calls


async def test_asks_go_out_until_every_gateway_answered() -> None:
    ask, calls = _picker([1, 1, 1, 2])  # the handle prefers gateway 1
    answers, errors = await each_gateway(ask, {1, 2}, pause_s=0.0)
    assert set(answers) == {1, 2}
    assert errors == []
    assert len(calls) == 4  # one round: two asks per gateway


async def test_a_gateway_that_never_answers_is_left_out_after_the_rounds() -> None:
    ask, calls = _picker([1, RuntimeError("boom")])
    answers, errors = await each_gateway(ask, {1, 2}, rounds=3, pause_s=0.0)
    assert set(answers) == {1}
    assert len(calls) == 3 * 4
    assert errors[0] == "RuntimeError: boom"
    assert len(errors) == 6


async def test_an_answer_from_a_gateway_started_since_is_kept() -> None:
    ask, _ = _picker([1, 3, 2])
    answers, _ = await each_gateway(ask, {1, 2}, pause_s=0.0)
    assert set(answers) == {1, 2, 3}
