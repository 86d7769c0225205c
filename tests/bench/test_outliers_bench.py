"""The outlier-capture benchmark (``firstlight bench outliers``): its workload, its
summary of captures (false ones, the planted one, the fields a record carries), the
stored run the docs show, and the options it refuses before starting anything."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from firstlight.telemetry.outliers import OutlierRecord
from firstlight_bench.reports.results import Outcome
from firstlight_bench.tools.outliers import FIELDS, markers, render, summarize
from firstlight_bench.tools.outliers_run import Asked, planted_messages, steady_messages
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs/observability.md"
STORED = REPO / "docs/benchmarks/outliers-sim/results.json"
AT = 1_000_000.0


def test_the_fields_are_the_doc_tables_and_the_records() -> None:
    section = PAGE.read_text().split("## Outliers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = [name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])]
    assert tuple(listed) == FIELDS
    assert set(FIELDS) <= {f.name for f in dataclasses.fields(OutlierRecord)}


def test_the_steady_prompts_are_alike_and_the_planted_one_far_longer() -> None:
    steady = [len(steady_messages(i)[0]["content"]) for i in range(200)]
    assert max(steady) - min(steady) <= 6
    assert len({steady_messages(i)[0]["content"] for i in range(200)}) == 200
    planted = planted_messages(0, 2000)[0]["content"]
    assert len(planted) == 2000
    assert planted == planted_messages(0, 2000)[0]["content"]
    assert planted != planted_messages(1, 2000)[0]["content"]


def _asked(index: int, ttft_ms: float, *, phase: str = "steady", at: float = AT) -> Asked:
    """A request sent at 10 s (on the client's clock) whose answer took 300 ms after its
    first token."""
    first, end = 10.0 + ttft_ms / 1000, 10.3 + ttft_ms / 1000
    return Asked(phase, index, at, Outcome(f"chatcmpl-{index}", 10.0, first, end, 60, 16))


def test_a_request_is_stored_with_the_keys_and_nulls_of_the_stored_run() -> None:
    row = _asked(3, 120.0).row()
    assert list(row) == list(json.loads(STORED.read_text())["asked"][0])
    assert row == {
        "phase": "steady",
        "index": 3,
        "started_at": AT,
        "ttft_ms": pytest.approx(120.0),
        "e2e_ms": pytest.approx(420.0),
        "prompt_tokens": 60,
        "completion_tokens": 16,
        "request_id": "chatcmpl-3",
        "problem": None,
    }
    refused = Outcome("", 10.0, None, 12.0, error="APIConnectionError: Connection error.")
    assert Asked("planted", 0, AT, refused).row() == {
        "phase": "planted",
        "index": 0,
        "started_at": AT,
        "ttft_ms": None,
        "e2e_ms": pytest.approx(2000.0),
        "prompt_tokens": None,  # no usage came
        "completion_tokens": None,
        "request_id": None,  # no chunk came
        "problem": "APIConnectionError: Connection error.",
    }


def _record(**changes: Any) -> dict[str, Any]:
    """A dashboard capture (no ``request_id``) with every field set."""
    record: dict[str, Any] = {
        "at": AT + 100.0,
        "model": "m",
        "kinds": ["ttft", "e2e"],
        "factor": 10.0,
        "trace_id": "ab" * 16,
        "route": "local",
        "served_region": "outliers",
        "peer_region": None,
        "replica": "r1",
        "explanation": "r1 won",
        "predicted_ttft_ms": 4000.0,
        "ttft_ms": 4500.0,
        "dispatch_ttft_ms": 4490.0,
        "median_ttft_ms": 100.0,
        "e2e_ms": 4900.0,
        "median_e2e_ms": 400.0,
        "predicted_queue_wait_ms": 0.0,
        "replica_queue_len": 0,
        "cached_tokens": 0,
        "runner_up": "r2",
        "runner_up_ttft_ms": 4100.0,
        "input_tokens": 2000,
        "output_tokens": 16,
    }
    record.update(changes)
    return record


def _summary(
    after_steady: list[dict[str, Any]],
    after_planted: list[dict[str, Any]],
    *,
    log_records: list[dict[str, Any]] | None = None,
    traced: set[str] | None = None,
) -> dict[str, Any]:
    steady = [_asked(i, 100.0 + i) for i in range(101)]
    planted = _asked(0, 4600.0, phase="planted", at=AT + 50.0)
    return summarize(
        steady,
        planted,
        after_steady,
        after_planted,
        counted_steady={"ttft": float(len(after_steady)), "e2e": 0.0},
        counted_planted={"ttft": float(len(after_planted)), "e2e": 1.0},
        log_records=log_records,
        traced=traced,
    )


def _report(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        **summary,
        "simulated": True,
        "git_commit": "0" * 40,
        "command": "c",
        "concurrency": 4,
        "max_tokens": 16,
        "replicas": 2,
        "factor": 10.0,
        "min_samples": 50,
        "window_samples": 1000,
    }


def test_a_clean_run_captures_the_planted_request_with_every_field() -> None:
    planted = _record()
    summary = _summary(
        [],
        [planted],
        log_records=[{"request_id": "chatcmpl-0", "kinds": ["ttft"]}],
        traced={"ab" * 16},
    )
    assert summary["false_captures"] == 0
    assert summary["steady"]["ttft_p50_ms"] == pytest.approx(150.0)
    assert summary["steady"]["ttft_p99_ms"] == pytest.approx(199.0)
    assert summary["planted"]["captured"] is True
    assert summary["planted"]["median_ttft_ms"] == 100.0
    assert summary["fields_present"] == [f for f in FIELDS if f != "peer_region"]
    assert summary["fields_null_by_design"] == ["peer_region"]
    assert summary["fields_missing"] == []
    assert summary["log_line"] == "found"
    assert summary["trace_received"] is True
    text = render(_report(summary))
    assert text.startswith(markers(True)[0])
    assert text.endswith(markers(True)[1])
    assert "(factor 10, judged from the 50th request, a window of 1,000)" in text
    assert "| 101 (0 failed) | 60 | 150.0 ms | 199.0 ms | 0 (false) |" in text
    assert "Steady phase: 0 false captures (`firstlight_outliers_total`: 0 ttft, 0 e2e)" in text
    assert "captured as ttft, e2e; TTFT at the gateway 4500.0 ms against a median of" in text
    assert "100.0 ms (45 times)" in text
    assert "Fields missing: none." in text
    assert "request served in its own region: `peer_region`." in text
    assert "The WARNING log line: found; the trace id: it arrived at the OTLP receiver." in text


def test_a_capture_during_the_steady_phase_counts_as_false() -> None:
    false = _record(at=AT + 10.0, input_tokens=60, kinds=["ttft"])
    summary = _summary([false], [_record(), false])
    assert summary["false_captures"] == 1
    assert summary["false_capture_records"] == [false]
    assert summary["planted"]["captured"] is True  # the newer one, not the steady one
    assert summary["planted"]["record"]["input_tokens"] == 2000
    assert "Steady phase: 1 false captures (`firstlight_outliers_total`: 1 ttft" in render(
        _report(summary)
    )


def test_a_planted_request_not_captured_is_reported_so() -> None:
    steady_one = _record(at=AT + 10.0)
    summary = _summary([steady_one], [steady_one])  # nothing new after the planted one
    assert summary["planted"]["captured"] is False
    assert summary["fields_present"] == summary["fields_missing"] == []
    assert "Planted request: not captured." in render(_report(summary))


def test_a_missing_field_is_listed() -> None:
    forwarded = _record(route="spill_over", replica=None, runner_up=None, trace_id=None)
    summary = _summary([], [forwarded], log_records=[])
    # peer_region is expected only for a local route; the log line was not found.
    missing = ["request_id", "trace_id", "peer_region", "replica", "runner_up"]
    assert summary["fields_missing"] == missing
    assert summary["log_line"] == "not found"
    assert summary["trace_received"] is None
    text = render(_report(summary))
    assert (
        "Fields missing: `request_id`, `trace_id`, `peer_region`, `replica`, `runner_up`." in text
    )


def test_an_unreadable_log_leaves_the_request_id_unchecked() -> None:
    summary = _summary([], [_record()], log_records=None, traced={"cd" * 16})
    assert summary["fields_unchecked"] == ["request_id"]
    assert "request_id" not in summary["fields_missing"]
    assert summary["log_line"] == "not checked"
    assert summary["trace_received"] is False
    text = render(_report(summary))
    assert "Not checked (the gateway's log was not readable): `request_id`." in text
    assert "it did not arrive at the OTLP receiver" in text


def test_the_observability_page_shows_the_stored_run() -> None:
    stored = json.loads(STORED.read_text())
    assert stored["simulated"] is True
    begin, end = markers(True)
    page = PAGE.read_text()
    section = shown_section(page, begin, end)
    assert section == render(stored), (
        "docs/observability.md is stale: firstlight bench outliers --tables-only "
        "--out docs/benchmarks/outliers-sim --page docs/observability.md"
    )


def test_tables_only_rewrites_the_page_from_the_stored_run(tmp_path: Path) -> None:
    stored = json.loads(STORED.read_text())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(STORED.read_text())
    begin, end = markers(True)
    page = tmp_path / "page.md"
    page.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    result = run_bench(
        "outliers", "--tables-only", "--out", str(tmp_path / "run"), "--page", str(page)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing measured, nothing printed
    assert page.read_text() == f"before\n{render(stored)}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "gpu"], "'--engine'"),
        (["--concurrency", "0"], "'--concurrency'"),
        (["--seed", "-1"], "'--seed'"),
        (["--tables-only", "--page", "x.md"], "--tables-only needs --out"),
        (["--requests", "10"], "--requests: 10: at least telemetry.outlier_min_samples (50)"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("outliers", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
