"""The advisor benchmark (``firstlight_bench.tools.advisor``): its workload, its comparison of
the predicted and the measured saving, and the stored run the docs show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firstlight_bench.reports.results import Outcome
from firstlight_bench.tools.advisor import Asked, markers, prompts, render, static_prompt, summarize
from tests.bench.bench_cli import run_bench

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "docs/benchmarks/advisor-vllm-cpu/results.json"


def test_the_arms_put_the_same_parts_in_opposite_orders() -> None:
    static = static_prompt(0)
    assert static == static_prompt(0) != static_prompt(1)
    first = prompts("variable-first", 3, static)[0]["content"]
    last = prompts("static-first", 3, static)[0]["content"]
    assert first.endswith(static)
    assert last.startswith(static)
    assert sorted(first.split("\n")) == sorted(last.split("\n"))
    # Every request's variable line differs from every other's.
    lines = {prompts("static-first", i, static)[0]["content"].rsplit("\n", 1)[1] for i in range(99)}
    assert len(lines) == 99


def _row(group: str, requests: int, findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "group": group,
        "requests": requests,
        "findings": findings,
        "prefill_ms_per_100_tokens": 30.0,
        "price_source": "measured",
        "cost_model_ms_per_100_tokens": 10.0,
    }


def _asked(arm: str, index: int, prompt_tokens: int, cached: int, ttft_ms: float) -> Asked:
    """A request sent at 5 s that got its one token ``ttft_ms`` later."""
    seen = 5.0 + ttft_ms / 1000
    return Asked(arm, index, Outcome(f"{arm}-{index}", 5.0, seen, seen, prompt_tokens, 1, cached))


def test_a_request_is_stored_with_the_keys_and_units_of_the_stored_run() -> None:
    row = _asked("static-first", 3, 640, 608, 110.0).row()
    assert list(row) == list(json.loads(STORED.read_text())["asked"][0])
    assert row == {
        "arm": "static-first",
        "index": 3,
        "prompt_tokens": 640,
        "cached_tokens": 608,
        "ttft_ms": pytest.approx(110.0),
    }


def test_the_prediction_is_scaled_to_the_requests_it_affected() -> None:
    asked = [
        _asked("variable-first", 1, 640, 0, 300.0),
        _asked("static-first", 1, 640, 608, 110.0),
        _asked("variable-first", 2, 640, 0, 320.0),
        _asked("static-first", 2, 640, 608, 130.0),
    ]
    finding = {
        "kind": "variable_prefix",
        "requests": 2,
        "tokens_per_request": 400.0,
        "saving_ms_per_request": 120.0,
    }
    rows = {
        "variable-first": [_row("variable-first", 3, [finding])],
        "static-first": [_row("static-first", 3, [])],
    }
    summary = summarize(asked, rows)
    assert summary["predicted_tokens"] == pytest.approx(600.0)
    assert summary["predicted_saving_ms"] == pytest.approx(180.0)
    assert summary["measured_saving_ms"] == pytest.approx(190.0)
    assert summary["relative_error"] == pytest.approx(10 / 190)
    assert summary["static_first_flagged"] is False
    assert summary["cost_model_saving_ms"] == pytest.approx(60.0)  # 600 tokens at 0.1 ms
    assert summary["cost_model_relative_error"] == pytest.approx(130 / 190)
    report = {**summary, "simulated": True, "git_commit": "0" * 40, "command": "c", "requests": 2}
    text = render(report)
    assert text.startswith(markers(True)[0])
    assert text.endswith(markers(True)[1])
    assert "| static-first | 640 | 608 | 120.0 ms | 120.0 ms |" in text
    assert "600 tokens per request" in text
    assert "180.0 ms (at 30.0 ms per 100 tokens, the slope of the TTFT" in text
    assert "an error of 5.3%, within the 20 % goal" in text
    assert "For the static-first arm the advisor had none." in text
    assert "(10.0 ms per 100 tokens, what the router predicts with)" in text
    assert "would save 60.0 ms: an error of 68.4%." in text


def test_a_missing_or_false_finding_is_reported_as_such() -> None:
    asked = [_asked(arm, 1, 640, 0, 100.0) for arm in ("variable-first", "static-first")]
    false = {
        "kind": "variable_prefix",
        "requests": 1,
        "tokens_per_request": 9.0,
        "saving_ms_per_request": 1.0,
    }
    rows = {
        "variable-first": [_row("variable-first", 2, [])],
        "static-first": [_row("static-first", 2, [false])],
    }
    summary = summarize(asked, rows)
    assert summary["predicted_saving_ms"] is None
    assert summary["static_first_flagged"] is True
    report = {**summary, "simulated": False, "git_commit": "0" * 40, "command": "c", "requests": 1}
    text = render(report)
    assert "reported no `variable_prefix` finding" in text
    assert "flagged it (a false finding)" in text


def test_the_advisor_page_shows_the_stored_run() -> None:
    stored = json.loads(STORED.read_text())
    assert stored["simulated"] is False
    assert render(stored) in (REPO / "docs/prefix-advisor.md").read_text(), (
        "docs/prefix-advisor.md is stale: firstlight bench advisor --tables-only "
        "--out docs/benchmarks/advisor-vllm-cpu --page docs/prefix-advisor.md"
    )
    assert stored["requests"] >= 40
    assert not stored["static_first_flagged"]


def test_tables_only_rewrites_the_page_from_the_stored_run(tmp_path: Path) -> None:
    begin, end = markers(False)
    page = tmp_path / "prefix-advisor.md"
    page.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    result = run_bench("advisor", "--tables-only", "--out", str(STORED.parent), "--page", str(page))
    assert result.exit_code == 0, result.output
    assert page.read_text() == f"before\n{render(json.loads(STORED.read_text()))}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "tpu"], "'--engine'"),
        (["--requests", "1"], "'--requests'"),
        (["--seed", "-1"], "'--seed'"),
        (["--tables-only"], "--tables-only needs --out (the stored report) and --page"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    result = run_bench("advisor", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
